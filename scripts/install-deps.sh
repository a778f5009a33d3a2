#!/usr/bin/env bash
# Debian packages ferrofs needs at run and test time: FUSE userspace tools and headers, and
# e2fsprogs for the differential test against kernel ext4, a TrueType font for the plots the
# seed-benchmark test draws, and mount (mount, umount, losetup) for the mount tests.
# Installs only what is missing; needs root (skips with a message otherwise: FUSE tests then
# print SKIPPED).
set -euo pipefail
. "$(dirname "$0")/lib/apt.sh"
install_missing install-deps 0 fuse3 libfuse3-dev pkg-config e2fsprogs fonts-dejavu-core mount
