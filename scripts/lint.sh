#!/usr/bin/env bash
# Style gates: rustfmt (rustfmt.toml), clippy with warnings as errors, and commit subjects of
# at most 72 characters (details go in the body) on every commit since SUBJECT_BASE.
set -euo pipefail
cd "$(dirname "$0")/.."

# Subjects before this commit were written before the rule; it is not moved as the branch grows.
SUBJECT_BASE=520e9bf
SUBJECT_MAX=72

status=0
cargo fmt --all --check || { echo "lint: cargo fmt --all --check failed (run cargo fmt --all)" >&2; status=1; }
cargo clippy --workspace --all-targets --locked -- -D warnings || { echo "lint: clippy failed" >&2; status=1; }
# Without the tests, so without the engine's `testing` feature that their dev-dependencies turn
# on: the build users get, where an item only tests use is dead code.
cargo clippy --workspace --locked -- -D warnings || { echo "lint: clippy (no tests) failed" >&2; status=1; }

if ! git rev-parse --git-dir >/dev/null 2>&1; then
  echo "lint: not a git checkout; commit subjects not checked"
elif [ "$(git rev-parse --is-shallow-repository)" = true ]; then
  echo "lint: shallow checkout; commit subjects not checked"
elif ! git cat-file -e "$SUBJECT_BASE^{commit}" 2>/dev/null; then
  echo "lint: base commit $SUBJECT_BASE absent; commit subjects not checked"
else
  subjects=$(git log --format=%s "$SUBJECT_BASE..HEAD")
  long=$(awk -v max="$SUBJECT_MAX" 'length($0) > max' <<<"$subjects")
  if [ -n "$long" ]; then
    echo "lint: commit subjects over $SUBJECT_MAX characters since $SUBJECT_BASE:" >&2
    printf '  %s\n' "$long" >&2
    status=1
  else
    echo "lint: $(grep -c . <<<"$subjects" || true) commit subjects since $SUBJECT_BASE, none over $SUBJECT_MAX characters"
  fi
fi
exit "$status"
