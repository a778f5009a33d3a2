#!/usr/bin/env bash
# Debian packages the side-by-side benchmarks need (`ferrofs bench fsmark`, `bench seeds`):
# fs_mark, dbench, the peer file systems (fuse2fs, XFS and btrfs tools, e2fsprogs), what
# minifuse compiles with, and a TrueType font for the plots (fonts-dejavu-core).
# Not needed for the tests (scripts/install-deps.sh is). Installs only what is missing; needs root.
set -euo pipefail
. "$(dirname "$0")/lib/apt.sh"
install_missing install-bench-deps 1 fsmark dbench fonts-dejavu-core fuse3 fuse2fs e2fsprogs xfsprogs btrfs-progs libfuse3-dev pkg-config gcc
