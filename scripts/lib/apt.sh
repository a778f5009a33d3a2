# install_missing NAME STRICT PACKAGE...: apt-get install the Debian packages that are not
# installed yet. Without root or apt-get: a message, then exit status 1 if STRICT is 1, else 0.
install_missing() {
  local name=$1 strict=$2
  shift 2
  local missing=()
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "$name: missing ${missing[*]} and cannot install them (not root or no apt-get)" >&2
    return "$strict"
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
}
