#!/usr/bin/env bash
# A local S3-compatible server for the tests and benchmarks of published images: versitygw
# (Apache-2.0, one static Go binary) serving a plain directory (its posix backend), on a free
# localhost port, with root credentials and one bucket. DESIGN, "Mounting a published image",
# says why this server.
#
#   scripts/s3-server.sh install      build versitygw if missing; print its path
#   scripts/s3-server.sh start STATE  start a server whose files and pid live under STATE (a
#                                     new directory, or one a `kill` left: the same port and
#                                     objects again); print what a client needs as
#                                     KEY=value lines (S3_ENDPOINT, S3_BUCKET,
#                                     AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION)
#   scripts/s3-server.sh kill STATE   stop the server, keep its objects (a fault mid-read)
#   scripts/s3-server.sh stop STATE   stop the server and delete STATE
#
# Exit status 2 (with one line on stderr) when the server cannot be had: no Go toolchain to
# build it, or the build failed. Tests treat that as a skip.
set -euo pipefail

VERSITYGW_VERSION=v1.8.0
BUCKET=ferrofs
ACCESS_KEY=ferrofs-test
SECRET_KEY=ferrofs-test-secret
REGION=us-east-1

# Go's official tarball installs outside the default PATH.
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then PATH="$PATH:/usr/local/go/bin"; fi

die() { echo "s3-server: $*" >&2; exit 1; }
unavailable() { echo "s3-server: $*" >&2; exit 2; }

versitygw_path() {
  if command -v versitygw >/dev/null; then command -v versitygw; return; fi
  if command -v go >/dev/null; then
    local bin; bin="$(go env GOBIN)"; bin="${bin:-$(go env GOPATH)/bin}"
    if [ -x "$bin/versitygw" ]; then echo "$bin/versitygw"; return; fi
  elif [ -x "$HOME/go/bin/versitygw" ]; then echo "$HOME/go/bin/versitygw"; return; fi
  return 1
}

install() {
  versitygw_path && return
  command -v go >/dev/null || unavailable "versitygw is not installed and there is no Go toolchain to build it"
  # Tests start servers in parallel: one builds, the others wait for it.
  exec 9>"${TMPDIR:-/tmp}/ferrofs-versitygw-install.lock"
  flock 9
  versitygw_path && return
  echo "s3-server: building versitygw $VERSITYGW_VERSION (go install, a few minutes once)" >&2
  go install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION" >&2 \
    || unavailable "go install of versitygw $VERSITYGW_VERSION failed"
  versitygw_path || unavailable "versitygw built but not found in GOBIN or GOPATH/bin"
}

# A port nothing listens on now (a connection to it is refused).
free_port() {
  local port
  for _ in $(seq 100); do
    port=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return; fi
  done
  die "no free localhost port found"
}

# Sign with SigV4 (curl >= 7.75) so that no S3 client is needed to make the bucket.
s3_curl() {
  curl -sS --fail-with-body --aws-sigv4 "aws:amz:$REGION:s3" --user "$ACCESS_KEY:$SECRET_KEY" \
    -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$@"
}

start() {
  local state="$1" gw port endpoint
  gw="$(install)"
  mkdir -p "$state/root"
  [ -f "$state/port" ] || free_port >"$state/port"
  port="$(cat "$state/port")"
  endpoint="http://127.0.0.1:$port"
  if [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; then
    die "a server is already running for $state (pid $(cat "$state/pid"))"
  fi
  # setsid: the server outlives neither a `stop` nor this script's process group signals.
  ROOT_ACCESS_KEY="$ACCESS_KEY" ROOT_SECRET_KEY="$SECRET_KEY" \
    setsid "$gw" --port "127.0.0.1:$port" --region "$REGION" --quiet posix "$state/root" \
    >"$state/log" 2>&1 </dev/null &
  echo $! >"$state/pid"
  local tries=0
  until curl -s -o /dev/null "$endpoint/"; do
    kill -0 "$(cat "$state/pid")" 2>/dev/null || die "versitygw exited at start: $(tail -3 "$state/log")"
    tries=$((tries + 1))
    [ "$tries" -lt 200 ] || { kill_server "$state"; die "versitygw did not listen on $endpoint within 10 s"; }
    sleep 0.05
  done
  if [ ! -d "$state/root/$BUCKET" ] && ! s3_curl -X PUT "$endpoint/$BUCKET" >/dev/null; then
    kill_server "$state"
    die "cannot create bucket $BUCKET"
  fi
  cat <<EOF
S3_ENDPOINT=$endpoint
S3_BUCKET=$BUCKET
AWS_ACCESS_KEY_ID=$ACCESS_KEY
AWS_SECRET_ACCESS_KEY=$SECRET_KEY
AWS_REGION=$REGION
S3_PID=$(cat "$state/pid")
EOF
}

kill_server() {
  local state="$1" pid
  [ -f "$state/pid" ] || return 0
  pid="$(cat "$state/pid")"
  rm -f "$state/pid"
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.05; done
  kill -9 "$pid" 2>/dev/null || true
}

case "${1:-}" in
  install) install ;;
  start) [ $# -eq 2 ] || die "usage: $0 start STATE_DIR"; start "$2" ;;
  kill) [ $# -eq 2 ] || die "usage: $0 kill STATE_DIR"; kill_server "$2" ;;
  stop) [ $# -eq 2 ] || die "usage: $0 stop STATE_DIR"; kill_server "$2"; rm -rf "$2" ;;
  *) die "usage: $0 install | start STATE_DIR | kill STATE_DIR | stop STATE_DIR" ;;
esac
