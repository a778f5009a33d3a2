#!/usr/bin/env bash
# Soak a mount with other people's workloads: stress-ng's file-system stressors, each with 4
# workers for SECONDS_PER seconds (default 15), on a fresh image in /dev/shm. Fails if a stressor reports a
# failure, if the daemon dies, or if fsck finds anything after the unmount. Not part of the
# test suite (about 6 minutes); needs root, /dev/fuse and stress-ng (installed if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/apt.sh
if [ ! -e /dev/fuse ]; then
    echo "SKIPPED: no /dev/fuse"
    exit 0
fi
install_missing soak 1 stress-ng fuse3
cargo build --release --locked -p ferrofs-cli
ferrofs=$PWD/target/release/ferrofs
image=/dev/shm/ferrofs-soak-$$.img
mnt=$(mktemp -d)
unmount() {
    cd /
    if mountpoint -q "$mnt"; then umount "$mnt"; fi
    # umount returns before the daemon has checkpointed and released the image (bounded: 60 s).
    for _ in $(seq 300); do
        pgrep -f "ferrofs mount $image" >/dev/null || return 0
        sleep 0.2
    done
    echo "the daemon did not exit within 60 s of the unmount"
    return 1
}
trap 'unmount || true; rm -f "$image"; rmdir "$mnt"' EXIT
"$ferrofs" mkfs "$image" --size 2G >/dev/null
"$ferrofs" mount "$image" "$mnt" --daemon
daemon=$(pgrep -f "ferrofs mount $image")
failed=0
for s in dentry dir dirdeep filename fallocate getdent hdd io iomix link lockf rename seek \
    sync-file utime xattr chmod chown inode-flags mmap readahead sendfile splice symlink; do
    if (cd "$mnt" && stress-ng --"$s" 4 --timeout "${SECONDS_PER:-15}s" --temp-path "$mnt" >/dev/null 2>&1); then
        echo "$s: passed"
    else
        echo "$s: FAILED"
        failed=1
    fi
    if ! kill -0 "$daemon" 2>/dev/null; then
        echo "the daemon died during $s"
        exit 1
    fi
done
unmount
"$ferrofs" fsck "$image" -n || failed=1
exit $failed
