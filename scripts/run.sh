#!/usr/bin/env bash
# The main job: build ferrofs, make ferrofs.img (1 GiB, sparse) if it is absent, and mount it
# on ./mnt in the foreground. Ctrl-C (or umount ./mnt from another shell) unmounts cleanly.
# IMAGE, MOUNTPOINT and SIZE may be set in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
image=${IMAGE:-ferrofs.img}
mnt=${MOUNTPOINT:-mnt}
scripts/install-deps.sh
cargo build --release --locked -p ferrofs-cli
mkdir -p "$mnt"
exec target/release/ferrofs mount --mkfs "${SIZE:-1G}" "$image" "$mnt"
