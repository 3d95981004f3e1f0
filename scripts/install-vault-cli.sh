#!/usr/bin/env bash
# Builds HashiCorp Vault's own `vault` CLI (v1.20.4: client and dev server in one
# binary) from its Go packages (tools/vaultcli), for test/vaultdoc, which runs
# docs/vault.md's commands as an operator types them. Like scripts/vaultdev.sh it
# vendors the modules in a scratch dir and applies tools/vaultdev/patches (the
# published sdk lags the one Vault v1.20.4 was built with), then builds.
#
# The binary is keyed by a hash of tools/vaultcli/{go.mod,go.sum,main.go} and the
# patches, cached in ${EGRESSD_CACHE:-$HOME/.cache/egressd}/vaultcli/<hash>/vault
# (every clone on the machine shares it) and linked to .cache/bin/vault. A cached
# run takes milliseconds; a cold one downloads the modules (most shared with
# vaultdev's) and compiles all of Vault's built-in plugins.
#
# NOT YET WORKING, so `make deps` does not run it: the CLI compiles every
# built-in plugin, and builtin/logical/transit needs sdk/helper/keysutil's
# SLH-DSA key types, which tools/vaultdev/patches does not add to the published
# sdk v0.18.0 (the build fails there after ~45 min on a loaded 2-CPU machine).
# The patch needs that part of Vault v1.20.4's in-tree sdk too.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=$ROOT/tools/vaultcli
PATCHES=$ROOT/tools/vaultdev/patches
CACHE_ROOT=${EGRESSD_CACHE:-${HOME:-/tmp}/.cache/egressd}/vaultcli

say() { echo "install-vault-cli: $*" >&2; }
die() {
  echo "install-vault-cli: error: $*" >&2
  exit 1
}
# shellcheck source=scripts/lib/buildlock.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/buildlock.sh"

key() {
  (
    cd "$SRC"
    cat go.mod go.sum main.go "$PATCHES"/*
    uname -sm
  ) | sha256sum | cut -c1-16
}

build_into() { # $1: final directory
  local dir=$1 work t0 p
  work=$(mktemp -d "$CACHE_ROOT/.build-XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  t0=$(date +%s)
  cp "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" "$work/"
  cd "$work"
  export GONOSUMDB='github.com/hashicorp/*' GOFLAGS='-mod=mod -buildvcs=false' CGO_ENABLED=0
  say "building the vault CLI v1.20.4 (key $(basename "$dir")) in $work"
  go mod download >&2 || die "go mod download failed (needs the Go module proxy: $(go env GOPROXY))"
  go mod vendor >&2 || die "go mod vendor failed"
  for p in "$PATCHES"/*.patch; do
    patch -p1 --forward --batch --quiet <"$p" >&2 || die "patch $p did not apply to the vendored sdk"
  done
  GOFLAGS='-mod=vendor -buildvcs=false' go build -trimpath -ldflags='-s -w' -o "$work/vault" . >&2 ||
    die "go build failed (see above)"
  mkdir -p "$dir"
  mv "$work/vault" "$dir/vault"
  cd "$ROOT"
  rm -rf "$work"
  trap - EXIT
  say "built $dir/vault in $(($(date +%s) - t0))s"
}

k=$(key)
dir=$CACHE_ROOT/$k
if [ ! -x "$dir/vault" ]; then
  command -v patch >/dev/null 2>&1 || die "'patch' is not installed (make deps installs it via scripts/vaultdev.sh)"
  mkdir -p "$CACHE_ROOT"
  build_lock "$CACHE_ROOT" "$k"
  [ -x "$dir/vault" ] || build_into "$dir"
  build_unlock
fi
mkdir -p "$ROOT/.cache/bin"
ln -sfn "$dir/vault" "$ROOT/.cache/bin/vault"
