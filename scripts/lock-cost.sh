#!/usr/bin/env bash
# What lock counting costs: `ferrofs bench` (create/stat/remove) with --lock-counting on and
# off, alternating process by process (on first in odd pairs, off first in even ones), then
# the median create ops/s and CPU us/op of each setting and the overhead of counting.
# Usage: scripts/lock-cost.sh [PAIRS (default 6)] [extra ferrofs bench arguments...]
# FERROFS names the binary (default target/release/ferrofs); its `bench` runs the ferrofs-bench
# next to it (`cargo build --release -p ferrofs-cli -p ferrofs-bench`).
set -euo pipefail
pairs=${1:-6}
shift || true
bin=${FERROFS:-target/release/ferrofs}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 1 "$pairs"); do
    if ((i % 2)); then order="on off"; else order="off on"; fi
    for mode in $order; do
        "$bin" bench --big-dir 0 --runs 1 "$@" --lock-counting "$mode" --json "$dir/$mode.$i.json" >/dev/null
    done
done
python3 - "$dir" "$pairs" <<'PY'
import glob, json, statistics, sys
d, pairs = sys.argv[1], int(sys.argv[2])
med = {}
for mode in ("on", "off"):
    rows = {}
    for f in sorted(glob.glob(f"{d}/{mode}.*.json")):
        for c in json.load(open(f))["cycles"]:
            p = next(p for p in c["phases"] if p["phase"] == "create")
            rows.setdefault((c["layout"], c["threads"]), []).append((p["ops_per_sec"][0], p["cpu_us_per_op"][0]))
    med[mode] = rows
print(f"lock counting on vs off, {pairs} interleaved process pairs; create phase, median [min-max]")
print(f"{'layout':<8} {'thr':>3} {'ops/s on':>28} {'ops/s off':>28} {'ops/s cost':>10} {'CPU us/op on':>13} {'off':>6} {'CPU cost':>9}")
for key in sorted(med["on"]):
    on, off = med["on"][key], med["off"][key]
    r_on, r_off = [r for r, _ in on], [r for r, _ in off]
    c_on, c_off = statistics.median(c for _, c in on), statistics.median(c for _, c in off)
    m_on, m_off = statistics.median(r_on), statistics.median(r_off)
    cell = lambda m, v: f"{m:,.0f} [{min(v):,.0f}-{max(v):,.0f}]"
    print(f"{key[0]:<8} {key[1]:>3} {cell(m_on, r_on):>28} {cell(m_off, r_off):>28} {100*(m_off/m_on-1):>9.1f}% {c_on:>13.2f} {c_off:>6.2f} {100*(c_on/c_off-1):>8.1f}%")
PY
