#!/usr/bin/env bash
# The peer proxies egressd's bench measures beside egressd (tools/bench/peers.go):
#
#   goproxy      tools/peers (goproxybare): a bare github.com/elazarl/goproxy
#                v1.9.3 forward proxy, MITM for the hosts it is told to
#                intercept, with the bench's throwaway CA
#   smokescreen  github.com/stripe/smokescreen v0.1.0, as `go install` builds it
#
#   scripts/peers.sh build [goproxy|smokescreen ...]
#                build the named peers (default: both) unless cached, and print
#                one line per peer built:  goproxy=/path  smokescreen=/path
#                A peer that fails to build prints no line (its error goes to
#                stderr); the others are still built, and the exit status is 1.
#
# goproxybare is keyed by a hash of tools/peers/{go.mod,go.sum,main.go} (and the
# platform), smokescreen by its version; both are cached in
# ${EGRESSD_CACHE:-$HOME/.cache/egressd}/peers/{goproxybare-<hash>,smokescreen-<version>}/
# so every clone on the machine shares them; .cache/peers/ in the repo links to
# them. A cold build needs the Go module proxy and takes tens of seconds each;
# a cached `build` takes milliseconds.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=$ROOT/tools/peers
CACHE_ROOT=${EGRESSD_CACHE:-${HOME:-/tmp}/.cache/egressd}/peers
LOCAL=$ROOT/.cache/peers
SMOKESCREEN_VERSION=v0.1.0

say() { echo "peers: $*" >&2; }
die() {
  echo "peers: error: $*" >&2
  exit 1
}
# shellcheck source=scripts/lib/buildlock.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/buildlock.sh"

# goproxy_key: hash of the inputs that decide goproxybare (and the platform).
goproxy_key() { module_key "$SRC"; }

link_local() { # $1: link name, $2: cached binary
  mkdir -p "$LOCAL"
  ln -sfn "$2" "$LOCAL/$1"
}

# cached: print the cached binary $2 in $1 (a directory under CACHE_ROOT),
# building it with build_$3 first if needed, one build per key at a time.
cached() { # $1: dir name, $2: binary name, $3: peer
  local dir=$CACHE_ROOT/$1 bin=$CACHE_ROOT/$1/$2
  if [ -x "$bin" ]; then
    link_local "$2" "$bin"
    echo "$bin"
    return
  fi
  command -v go >/dev/null 2>&1 || die "go is not on PATH"
  mkdir -p "$CACHE_ROOT" || die "cannot create $CACHE_ROOT (set EGRESSD_CACHE)"
  build_lock "$CACHE_ROOT" "$1"
  if [ ! -x "$bin" ]; then
    local work t0
    work=$(mktemp -d "$CACHE_ROOT/.build-XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" EXIT
    t0=$(date +%s)
    "build_$3" "$work" "$2"
    mkdir -p "$dir"
    mv "$work/$2" "$dir/$2.tmp"
    mv "$dir/$2.tmp" "$dir/$2"
    rm -rf "$work"
    trap - EXIT
    say "built $bin in $(($(date +%s) - t0))s"
  fi
  build_unlock
  [ -x "$bin" ] || die "build finished but $bin is missing"
  link_local "$2" "$bin"
  echo "$bin"
}

build_goproxy() { # $1: scratch dir, $2: binary name
  cp "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" "$1/"
  say "building goproxybare (tools/peers, goproxy $(awk '{for (i = 1; i < NF; i++) if ($i == "github.com/elazarl/goproxy") { print $(i + 1); exit }}' "$SRC/go.mod"))"
  (
    cd "$1"
    GOFLAGS='-mod=readonly -buildvcs=false' CGO_ENABLED=0 \
      go build -trimpath -ldflags='-s -w' -o "$1/$2" . >&2
  ) || die "goproxy: go build failed (needs the Go module proxy for a cold build: $(go env GOPROXY))"
}

build_smokescreen() { # $1: scratch dir, $2: binary name
  say "building smokescreen $SMOKESCREEN_VERSION (go install github.com/stripe/smokescreen@$SMOKESCREEN_VERSION)"
  (
    cd "$1"
    GOBIN=$1 GOFLAGS='-buildvcs=false' CGO_ENABLED=0 \
      go install -trimpath -ldflags='-s -w' "github.com/stripe/smokescreen@$SMOKESCREEN_VERSION" >&2
  ) || die "smokescreen: go install failed (needs the Go module proxy for a cold build: $(go env GOPROXY))"
}

# build_one: print name=path for one peer; a failure is reported, not fatal.
build_one() { # $1: peer
  local bin
  case "$1" in
  goproxy) bin=$( cached "goproxybare-$(goproxy_key)" goproxybare goproxy) ;;
  smokescreen) bin=$( cached "smokescreen-$SMOKESCREEN_VERSION" smokescreen smokescreen) ;;
  *)
    say "error: unknown peer '$1' (known: goproxy, smokescreen)"
    return 1
    ;;
  esac || return 1
  echo "$1=$bin"
}

cmd_build() {
  local p status=0
  [ $# -gt 0 ] || set -- goproxy smokescreen
  for p in "$@"; do
    build_one "$p" || status=1
  done
  return $status
}

case "${1:-}" in
build)
  shift
  cmd_build "$@"
  ;;
*)
  echo "usage: $0 build [goproxy|smokescreen ...]" >&2
  exit 2
  ;;
esac
