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
FUSE_SUITES=(--test conformance --test differential --test mount --test semantics)
FERROFS_TEST_DEFAULT_PERMISSIONS=1 cargo test -p ferrofs-fuse --locked "${FUSE_SUITES[@]}" 2>&1
# Published images mounted from a local S3 server (scripts/s3-server.sh), kernel checks too.
FERROFS_TEST_DEFAULT_PERMISSIONS=1 cargo test -p ferrofs-cli --locked --test remote_mount 2>&1
# Both again (ferrofs checking, then the kernel) with the kernel's writeback cache
# (-o writeback_cache, off by default): all four
# corners of permissions x writeback cache, since the cache changes what the kernel sends in
# each mode (times set by the kernel, writes gathered at close). These suites run in ~15 s of
# a suite that takes minutes, so two more runs cost little. Skipped there, and only there: the
# tests of what the cache cannot give (docs/DESIGN.md, "The writeback cache"): SEEK_DATA,
# st_blocks and statfs of pages still dirty in the kernel, atime of reads after a write, a
# write past the largest file accepted into the page cache, and (daemon_permissions) a
# non-owner's utimes(NULL), which the kernel sends as a chosen time.
WRITEBACK_GAPS=(--skip sparse_files_seek_data_and_hole --skip statfs_and_open_unlinked_files
    --skip unlinked_file_lives_until_last_close --skip atime_relatime_by_default_and_as_an_option
    --skip atime_noatime_and_nodiratime --skip hostile_requests_get_errors_not_crashes)
FERROFS_TEST_WRITEBACK_CACHE=1 cargo test -p ferrofs-fuse --locked "${FUSE_SUITES[@]}" -- "${WRITEBACK_GAPS[@]}" \
    --skip utimensat_now_and_omit 2>&1
FERROFS_TEST_WRITEBACK_CACHE=1 FERROFS_TEST_DEFAULT_PERMISSIONS=1 cargo test -p ferrofs-fuse --locked \
    "${FUSE_SUITES[@]}" -- "${WRITEBACK_GAPS[@]}" 2>&1
# Both permission modes again with -o discard (blocks punched once the checkpoint freeing them
# is durable, by a thread of their own): what the suites see must not change.
FERROFS_TEST_DISCARD=1 cargo test -p ferrofs-fuse --locked "${FUSE_SUITES[@]}" 2>&1
FERROFS_TEST_DISCARD=1 FERROFS_TEST_DEFAULT_PERMISSIONS=1 cargo test -p ferrofs-fuse --locked "${FUSE_SUITES[@]}" 2>&1
# The FUSE suites (conformance, differential against ext4, mount with its SIGKILL test,
# semantics, the integrity run with its remounts, the limits), the CLI's mount lifecycle
# (umount, SIGKILL and log recovery, remount, the mount(8) helper) and its shared daemon again
# over FUSE-over-io_uring (-o uring), where the kernel has it, in both permission modes
# (differential, integrity and limits add about 11 s per mode, the shared daemon 1 s). The
# fuse module's enable_uring is system-wide: switched on (as root) for these runs only and set
# back afterwards; without it (or without root) the tests skip with a message.
URING_PARAM=/sys/module/fuse/parameters/enable_uring
if [[ -w $URING_PARAM ]]; then
    uring_was=$(cat "$URING_PARAM")
    trap 'echo "$uring_was" > "$URING_PARAM"' EXIT
    echo Y > "$URING_PARAM"
fi
URING_SUITES=("${FUSE_SUITES[@]}" --test integrity --test limits)
FERROFS_TEST_TRANSPORT=uring cargo test -p ferrofs-fuse --locked "${URING_SUITES[@]}" 2>&1
FERROFS_TEST_TRANSPORT=uring FERROFS_TEST_DEFAULT_PERMISSIONS=1 cargo test -p ferrofs-fuse --locked \
    "${URING_SUITES[@]}" 2>&1
FERROFS_TEST_TRANSPORT=uring cargo test -p ferrofs-cli --locked --test mount --test shared 2>&1
if [[ -n ${uring_was:-} ]]; then
    echo "$uring_was" > "$URING_PARAM"
    trap - EXIT
fi
# A separate build: with the feature the engine runs on shuttle's primitives, which work only
# under the checker, so only this test binary may run with it.
cargo test -p ferrofs --locked --features shuttle --test model_check 2>&1
