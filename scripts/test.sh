#!/usr/bin/env bash
# The whole test suite: unit, model-based, crash, corruption and FUSE tests.
# Tests that need /dev/fuse or root skip with a message where those are unavailable.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked 2>&1
