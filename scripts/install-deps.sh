#!/usr/bin/env bash
# Debian packages ferrofs needs at run and test time: FUSE userspace tools and headers, and
# e2fsprogs for the differential test against kernel ext4.
# Installs only what is missing; needs root (skips with a message otherwise).
set -euo pipefail
pkgs=(fuse3 libfuse3-dev pkg-config e2fsprogs)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "install-deps: missing ${missing[*]} and cannot install them (not root or no apt-get); FUSE tests will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
