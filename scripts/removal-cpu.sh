#!/usr/bin/env bash
# Where a mount's parallel removal spends CPU, for builds side by side: for each round and
# each binary in turn, make a fresh image in /dev/shm (the geometry `bench fsmark` uses for 8
# threads), mount it, create FILES zero-length files with fs_mark (8 threads, one directory
# each), then time the 8 `rm -rf` at once, with the daemon's CPU (/proc/PID/stat) and the
# whole machine's (/proc/stat) over the removal, and the daemon's peak RSS. Prints one line
# per run, then the median [min-max] of each binary.
# Usage: scripts/removal-cpu.sh [ROUNDS (default 3)] BINARY... (default target/release/ferrofs)
# FILES sets the file count (default 400000). Root; fs_mark (scripts/install-bench-deps.sh).
set -euo pipefail
rounds=${1:-3}
shift || true
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(target/release/ferrofs)
files=${FILES:-400000}
threads=8
command -v fs_mark >/dev/null || { echo "removal-cpu: fs_mark is missing (scripts/install-bench-deps.sh)" >&2; exit 1; }
work=$(mktemp -d /dev/shm/removal-cpu.XXXXXX)
mnt=$work/mnt
daemon=
cleanup() {
    if mountpoint -q "$mnt" 2>/dev/null; then umount "$mnt" || umount -l "$mnt"; fi
    [ -n "$daemon" ] && wait "$daemon" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir "$mnt"
ticks=$(getconf CLK_TCK)
# Busy ticks of the machine: user, nice, system, irq, softirq.
machine_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
daemon_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }

one_run() {
    local bin=$1 img=$work/img
    "$bin" mkfs "$img" --size 2G --ags $threads --bytes-per-inode 2048 --log-size 256M >"$work/mkfs.log" 2>&1 \
        || { cat "$work/mkfs.log" >&2; exit 1; }
    "$bin" mount "$img" "$mnt" >"$work/mount.log" 2>&1 &
    daemon=$!
    for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.05; done
    mountpoint -q "$mnt" || { cat "$work/mount.log" >&2; exit 1; }
    local dirs=()
    for t in $(seq 0 $((threads - 1))); do dirs+=(-d "$mnt/$t"); done
    (cd "$work" && fs_mark -S0 -s0 -k -L1 -D 100 -n $((files / threads)) -t 1 "${dirs[@]}" >/dev/null)
    local d0 c0 t0 d1 c1 t1 pids=()
    d0=$(daemon_ticks $daemon); c0=$(machine_ticks); t0=$(date +%s.%N)
    for t in $(seq 0 $((threads - 1))); do rm -rf "$mnt/$t" & pids+=($!); done
    wait "${pids[@]}"
    t1=$(date +%s.%N); c1=$(machine_ticks); d1=$(daemon_ticks $daemon)
    local hwm
    hwm=$(awk '/^VmHWM/{print $2}' "/proc/$daemon/status")
    umount "$mnt"
    wait "$daemon" || true
    daemon=
    rm -f "$img"
    awk -v b="$bin" -v f="$files" -v t0="$t0" -v t1="$t1" -v d="$((d1 - d0))" -v c="$((c1 - c0))" -v hz="$ticks" -v hwm="$hwm" \
        'BEGIN { printf "%s %.0f %.2f %.2f %.1f\n", b, f / (t1 - t0), d * 1e6 / hz / f, c * 1e6 / hz / f, hwm / 1024 }'
}

echo "binary  removal files/s  daemon CPU us/file  machine CPU us/file  daemon peak RSS MiB ($files files, $threads rm -rf at once)"
for r in $(seq 1 "$rounds"); do
    for bin in "${bins[@]}"; do one_run "$bin"; done
done | tee "$work/runs"
python3 - "$work/runs" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    b, *v = line.split()
    runs.setdefault(b, []).append([float(x) for x in v])
print("median [min-max]:")
for b, rows in runs.items():
    cols = list(zip(*rows))
    cell = lambda c, fmt: f"{fmt.format(statistics.median(c))} [{fmt.format(min(c))}-{fmt.format(max(c))}]"
    print(f"{b}: {cell(cols[0], '{:,.0f}')} files/s, daemon {cell(cols[1], '{:.2f}')} us, machine {cell(cols[2], '{:.2f}')} us, RSS {cell(cols[3], '{:.1f}')} MiB")
PY
