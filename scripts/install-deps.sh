#!/usr/bin/env bash
# Debian packages ferrofs needs at run and test time: FUSE userspace tools and headers, and
# e2fsprogs and xfsprogs for the differential tests against kernel ext4 and XFS, a TrueType font for the plots the
# seed-benchmark test draws.
# Installs only what is missing; needs root (skips with a message otherwise: FUSE tests then
# print SKIPPED).
set -euo pipefail
. "$(dirname "$0")/lib/apt.sh"
install_missing install-deps 0 fuse3 libfuse3-dev pkg-config e2fsprogs xfsprogs fonts-dejavu-core
