#!/usr/bin/env bash
# Install the ferrofs command in /usr/local/bin and the mount helper, so that
# `mount -t fuse.ferrofs IMAGE DIR` and /etc/fstab lines such as
#   /srv/data.img  /data  fuse.ferrofs  defaults,noatime  0 0
# work as for other FUSE file systems, with its man pages (man ferrofs, man ferrofs-mkfs, ...)
# and bash, zsh and fish completions (scripts/install-docs.sh). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${PREFIX:-/usr/local}
scripts/install-deps.sh
cargo build --release --locked -p ferrofs-cli
install -D -m 0755 target/release/ferrofs "$prefix/bin/ferrofs"
# mount(8) runs /sbin/mount.<type>; the binary acts as the helper when called by that name.
ln -sf "$prefix/bin/ferrofs" /sbin/mount.fuse.ferrofs
echo "installed $prefix/bin/ferrofs and /sbin/mount.fuse.ferrofs"
scripts/install-docs.sh "$prefix/bin/ferrofs" "$prefix"
