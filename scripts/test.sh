#!/usr/bin/env bash
# The whole test suite: unit, model-based, crash, corruption and FUSE tests, then the model
# checks of the concurrent fast paths (shuttle; docs/DESIGN.md, "Model checking").
# Tests that need /dev/fuse or root skip with a message where those are unavailable.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked 2>&1
# The README's embedded example, as a program: it must build and run (it exits non-zero on
# any failure).
cargo run -p ferrofs --locked --example embedded 2>&1
# The FUSE suites above mount with ferrofs checking permissions (-o daemon_permissions); run
# them again with the kernel checking (default_permissions, the mount's default): both modes
# must keep POSIX semantics.
FERROFS_TEST_DEFAULT_PERMISSIONS=1 cargo test -p ferrofs-fuse --locked --test conformance --test differential --test mount --test semantics 2>&1
# A separate build: with the feature the engine runs on shuttle's primitives, which work only
# under the checker, so only this test binary may run with it.
cargo test -p ferrofs --locked --features shuttle --test model_check 2>&1
