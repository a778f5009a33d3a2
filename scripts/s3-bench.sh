#!/usr/bin/env bash
# Reading a published image from 4 read-only mounts (issue 44), by hand, until `ferrofs bench
# published` does it: FILES files of 1-16 KiB in DIRS directories, published to a local
# versitygw (scripts/s3-server.sh); each of 4 mounts reads a disjoint quarter of the files and
# checks their SHA-256, while a `find` walks and stats one mount. Cases: the image mounted
# from local disk (one read-only mount, 4 readers); published with 0 ms and DELAY_MS added to
# every GET (a delay proxy), cold (empty chunk caches, one per mount as on 4 machines) and
# warm (the same caches, fresh mounts). Prints one line per case: seconds, files/s, bytes
# fetched and read (all mounts), chunk cache bytes. Root; needs python3.
#
#   FERROFS=path/to/ferrofs PROXY=path/to/delay_proxy FILES=20000 scripts/s3-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-20000}
DIRS=${DIRS:-100}
DELAY_MS=${DELAY_MS:-20}
FERROFS=${FERROFS:-target/release/ferrofs}
PROXY=${PROXY:-target/release/examples/delay_proxy}
W=$(mktemp -d /tmp/ferrofs-s3-bench.XXXXXX)
MOUNTS=()
PROXY_PID=
cleanup() {
  for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null || true; done
  [ -z "$PROXY_PID" ] || kill "$PROXY_PID" 2>/dev/null || true
  scripts/s3-server.sh stop "$W/s3" || true
  rm -rf "$W"
}
trap cleanup EXIT

eval "$(scripts/s3-server.sh start "$W/s3" | sed 's/^/export /')"
"$FERROFS" mkfs --size "$(( (FILES * 12 / 1024 + 256) ))M" "$W/image" >/dev/null
mkdir "$W/fill"
"$FERROFS" mount --daemon "$W/image" "$W/fill"
# The files, and their hashes by path (the readers' list).
python3 - "$W/fill" "$FILES" "$DIRS" "$W/hashes" <<'EOF'
import hashlib, os, random, sys
root, files, dirs, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = random.Random(44)
with open(out, "w") as h:
    for d in range(dirs):
        os.mkdir(f"{root}/d{d}")
    for i in range(files):
        path = f"d{i % dirs}/f{i}"
        data = rng.randbytes(rng.randint(1024, 16384))
        with open(f"{root}/{path}", "wb") as f:
            f.write(data)
        h.write(f"{hashlib.sha256(data).hexdigest()} {path}\n")
EOF
umount "$W/fill"
for _ in $(seq 300); do flock -n "$W/image" true 2>/dev/null && break; sleep 0.1; done
sleep 1
"$FERROFS" publish "$W/image" "s3://$S3_BUCKET/bench" --endpoint "$S3_ENDPOINT" >&2

# Read quarter Q (0-3) of the files under mount M, checking each hash.
read_quarter() {
  python3 - "$1" "$2" "$W/hashes" <<'EOF'
import hashlib, sys
mnt, q, listing = sys.argv[1], int(sys.argv[2]), sys.argv[3]
bad = 0
for n, line in enumerate(open(listing)):
    if n % 4 != q:
        continue
    digest, path = line.split()
    with open(f"{mnt}/{path}", "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() != digest:
            bad += 1
if bad:
    sys.exit(f"{bad} files differ under {mnt}")
EOF
}

# mount_all SOURCE OPTIONS [N]: N mounts (4), the i-th with OPTIONS with %i replaced by i.
mount_all() {
  local source="$1" options="$2"
  MOUNTS=()
  for i in $(seq 0 $((${3:-4} - 1))); do
    mkdir -p "$W/m$i"
    "$FERROFS" mount --daemon -o "${options//%i/$i}" "$source" "$W/m$i"
    MOUNTS+=("$W/m$i")
  done
}

umount_all() {
  for m in "${MOUNTS[@]}"; do umount "$m"; done
  MOUNTS=()
  sleep 1
}

run_case() {
  local label="$1" start end fetched read cache
  start=$(date +%s.%N)
  local readers=()
  for i in 0 1 2 3; do
    read_quarter "${MOUNTS[i % ${#MOUNTS[@]}]}" "$i" &
    readers+=($!)
  done
  find "${MOUNTS[0]}" -printf '%s\n' >/dev/null &
  readers+=($!)
  # Not a bare `wait`: the delay proxy runs in the background too.
  for pid in "${readers[@]}"; do wait "$pid"; done
  end=$(date +%s.%N)
  read -r fetched read < <("$FERROFS" mounts --json 2>/dev/null | python3 -c '
import json, sys
text = sys.stdin.read()
ms = json.loads(text[text.index("["):]) if "[" in text else []
print(sum(m["bytes_fetched"] for m in ms), sum(m["bytes_read"] for m in ms))')
  cache=$({ du -sb "$W"/cache* 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}')
  python3 -c "
import sys
files, secs = $FILES, $end - $start
print(f'$label: {secs:.1f} s, {files / secs:.0f} files/s, fetched {$fetched / 2**20:.1f} MiB, read {$read / 2**20:.1f} MiB, cache {$cache / 2**20:.1f} MiB')"
}

echo "files: $FILES in $DIRS directories; image $(du -sb "$W/image" | cut -f1) bytes allocated"
# An image file is mounted once: its 4 readers share that mount.
mount_all "$W/image" ro 1
run_case "local disk"
umount_all
url="s3://$S3_BUCKET/bench"
for delay in 0 "$DELAY_MS"; do
  endpoint="$S3_ENDPOINT"
  if [ "$delay" != 0 ]; then
    coproc PROXYP { "$PROXY" "${S3_ENDPOINT#http://}" "$delay"; }
    PROXY_PID=$PROXYP_PID
    read -r endpoint <&"${PROXYP[0]}"
  fi
  rm -rf "$W"/cache*
  mount_all "$url" "ro,cache=$W/cache%i,endpoint=$endpoint"
  run_case "s3 ${delay} ms cold"
  umount_all
  mount_all "$url" "ro,cache=$W/cache%i,endpoint=$endpoint"
  run_case "s3 ${delay} ms warm"
  umount_all
  if [ -n "$PROXY_PID" ]; then kill "$PROXY_PID"; PROXY_PID=; fi
done
