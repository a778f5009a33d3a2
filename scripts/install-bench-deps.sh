#!/usr/bin/env bash
# Debian packages the side-by-side benchmarks need (`ferrofs bench fsmark`, `bench seeds`):
# fs_mark, dbench, the peer file systems (fuse2fs, XFS and btrfs tools, e2fsprogs), what
# minifuse compiles with, and a TrueType font for the plots (fonts-dejavu-core).
# Not needed for the tests (scripts/install-deps.sh is). Installs only what is missing; needs root.
set -euo pipefail
pkgs=(fsmark dbench fonts-dejavu-core fuse3 fuse2fs e2fsprogs xfsprogs btrfs-progs libfuse3-dev pkg-config gcc)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "install-bench-deps: missing ${missing[*]} and cannot install them (not root or no apt-get)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
