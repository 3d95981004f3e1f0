#!/usr/bin/env bash
# A real HashiCorp Vault server (v1.20.4, in memory, unsealed, 127.0.0.1 only)
# for egressd's tests, built from Vault's Go packages in tools/vaultdev/.
#
#   scripts/vaultdev.sh build   build the binary unless cached; print its path
#   scripts/vaultdev.sh start   build if needed, start one server in the
#                               background, wait until ready, print
#                                 export VAULT_ADDR=...; export VAULT_TOKEN=...;
#                                 export EGRESSD_VAULTDEV_PID=...;
#                                 export EGRESSD_VAULTDEV_READY_FILE=...
#                               (use: eval "$(scripts/vaultdev.sh start)");
#                               each start is a new server, never stopping others
#   scripts/vaultdev.sh stop    stop the server in $EGRESSD_VAULTDEV_PID (else
#                               the last one `start` started in this checkout)
#
# The binary is keyed by a hash of tools/vaultdev/{go.mod,go.sum,main.go,
# patches/*} and cached in ${EGRESSD_CACHE:-$HOME/.cache/egressd}/vaultdev/<hash>/
# so every clone on the machine shares it; .cache/vaultdev/vaultdev in the
# repo links to it. A cold build (scripts/lib/buildlock.sh) downloads gigabytes
# of modules into GOMODCACHE, vendors them (in a scratch dir, deleted
# afterwards), applies tools/vaultdev/patches/*.patch to the vendored sdk and
# builds: minutes. A cached `build` takes milliseconds; `start` well under a second.
#
# Environment: EGRESSD_CACHE (cache root), VAULTDEV_ADDR (listen address for
# `start`, default 127.0.0.1:0 = a free port), VAULTDEV_ROOT_TOKEN (fixed root
# token ID for `start`), VAULTDEV_LOG_LEVEL (default warn; the log is
# .cache/vaultdev/run/<pid>/vault.log), VAULTDEV_START_TIMEOUT (seconds,
# default 60). Tests that need their own server (e.g. to kill and restart it)
# can run the binary from `build` directly: vaultdev -addr 127.0.0.1:0
# [-ready-file F] [-root-token T] prints the same JSON line when ready.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=$ROOT/tools/vaultdev
CACHE_ROOT=${EGRESSD_CACHE:-${HOME:-/tmp}/.cache/egressd}/vaultdev
LOCAL=$ROOT/.cache/vaultdev
RUN=$LOCAL/run

say() { echo "vaultdev: $*" >&2; }
die() {
  echo "vaultdev: error: $*" >&2
  exit 1
}
# shellcheck source=scripts/lib/buildlock.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/buildlock.sh"

link_local() { # $1: cached binary
  mkdir -p "$LOCAL"
  ln -sfn "$1" "$LOCAL/vaultdev"
}

# build: print the path of the cached binary, building it first if needed.
cmd_build() {
  local bin
  bin=$(cd "$SRC" && module_build "$CACHE_ROOT" "$SRC" vaultdev patches/*.patch)
  link_local "$bin"
  echo "$bin"
}

# alive: running and not a zombie (an exited server whose new parent, PID 1
# after setsid, has not reaped it yet).
alive() {
  [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null || return 1
  [ "$(awk '/^State:/{print $2}' "/proc/$1/status" 2>/dev/null)" != Z ]
}

# is_vaultdev: the pid is a running vaultdev (not a recycled pid).
is_vaultdev() {
  alive "$1" || return 1
  case "$(readlink "/proc/$1/exe" 2>/dev/null || true)" in
  */vaultdev) return 0 ;;
  "") [ ! -d /proc ] ;; # no /proc: trust the pid
  *) return 1 ;;
  esac
}

# Each `start` gets its own run directory (.cache/vaultdev/run/<pid>/: ready.json,
# stdout, vault.log), so concurrent runs in one checkout never stop each
# other's server; `start` never stops a running server.
cmd_start() {
  local bin pid i timeout addr tok dir d
  bin=$(cmd_build)
  mkdir -p "$RUN"
  # Run dirs of servers that are gone. A concurrent start's dir is start-* until
  # its pid file is written, and its pid is not vaultdev until the exec, so only
  # numbered dirs whose process is dead are removed (a recycled pid leaves a
  # stale dir behind, which is harmless).
  for d in "$RUN"/[0-9]*/; do
    [ -f "$d/pid" ] || continue
    alive "$(cat "$d/pid" 2>/dev/null || true)" || rm -rf "$d"
  done
  dir=$(mktemp -d "$RUN/start-XXXXXX")
  local args=(-addr "${VAULTDEV_ADDR:-127.0.0.1:0}" -log-level "${VAULTDEV_LOG_LEVEL:-warn}")
  [ -n "${VAULTDEV_ROOT_TOKEN:-}" ] && args+=(-root-token "$VAULTDEV_ROOT_TOKEN")
  # The output files are opened here, before the fork: a redirect in the
  # background child would race the rename below and, under load, find the
  # start-* path already gone.
  exec 3>"$dir/stdout" 4>"$dir/vault.log"
  # setsid: the server outlives this script and a ^C in the caller's shell.
  if command -v setsid >/dev/null 2>&1; then
    setsid "$bin" "${args[@]}" >&3 2>&4 </dev/null 3>&- 4>&- &
  else
    "$bin" "${args[@]}" >&3 2>&4 </dev/null 3>&- 4>&- &
  fi
  pid=$!
  exec 3>&- 4>&-
  echo "$pid" >"$dir/pid"
  mv "$dir" "$RUN/$pid"
  dir=$RUN/$pid
  echo "$pid" >"$RUN/last"
  timeout=${VAULTDEV_START_TIMEOUT:-60}
  # Ready when the server has printed its one JSON line.
  for ((i = 0; i < timeout * 20; i++)); do
    grep -q '"root_token"' "$dir/stdout" && break
    if ! alive "$pid"; then
      tail -n 30 "$dir/vault.log" >&2 || true
      die "the server exited before it was ready (log: $dir/vault.log)"
    fi
    sleep 0.05
  done
  if ! grep -q '"root_token"' "$dir/stdout"; then
    kill "$pid" 2>/dev/null || true
    tail -n 30 "$dir/vault.log" >&2 || true
    die "not ready within ${timeout}s (log: $dir/vault.log)"
  fi
  addr=$(sed -n 's/.*"addr":"\([^"]*\)".*/\1/p' "$dir/stdout")
  tok=$(sed -n 's/.*"root_token":"\([^"]*\)".*/\1/p' "$dir/stdout")
  [ -n "$addr" ] && [ -n "$tok" ] || die "cannot parse $dir/stdout"
  cp "$dir/stdout" "$dir/ready.json"
  echo "export VAULT_ADDR='$addr';"
  echo "export VAULT_TOKEN='$tok';"
  echo "export EGRESSD_VAULTDEV_PID='$pid';"
  # The ready line again, with the unseal key (to seal/unseal in tests).
  echo "export EGRESSD_VAULTDEV_READY_FILE='$dir/ready.json';"
}

# stop: the server in $EGRESSD_VAULTDEV_PID, else the last one `start` started.
cmd_stop() {
  local pid=${EGRESSD_VAULTDEV_PID:-} i
  if [ -z "$pid" ] && [ -f "$RUN/last" ]; then pid=$(cat "$RUN/last"); fi
  if [ -z "$pid" ]; then
    say "no server to stop"
    return 0
  fi
  if ! alive "$pid"; then
    say "pid $pid is not running"
  elif ! is_vaultdev "$pid"; then
    say "pid $pid is not a vaultdev server; leaving it alone"
    return 0
  else
    kill -TERM "$pid"
    for ((i = 0; i < 100; i++)); do
      alive "$pid" || break
      sleep 0.05
    done
    if alive "$pid"; then
      say "pid $pid did not exit on SIGTERM within 5s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  case "$pid" in *[!0-9]*) ;; *) rm -rf "${RUN:?}/$pid" ;; esac
  if [ -f "$RUN/last" ] && [ "$(cat "$RUN/last")" = "$pid" ]; then rm -f "$RUN/last"; fi
}

case "${1:-}" in
build) cmd_build ;;
start) cmd_start ;;
stop) cmd_stop ;;
*)
  echo "usage: $0 build|start|stop" >&2
  exit 2
  ;;
esac
