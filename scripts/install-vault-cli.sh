#!/usr/bin/env bash
# HashiCorp Vault's own `vault` CLI (v1.20.4: client and dev server in one
# binary), built from its Go module (tools/vaultcli) for test/vaultdoc, which runs
# docs/vault.md's commands as an operator types them.
#
#   scripts/install-vault-cli.sh        build unless cached, link .cache/bin/vault,
#                                       print the cached binary's path
#
# Vault v1.20.4 builds against its in-tree sdk and api, which no published
# version matches (and the module proxy serves no commit of them). tools/vaultcli
# takes api v1.22.0, which has every call the CLI makes, and the sdk v0.18.0 that
# Vault's go.mod names, vendored and patched up to what Vault uses: first
# tools/vaultdev/patches (what the dev server needs too), then
# tools/vaultcli/patches (what the CLI's built-in plugins need besides). Each
# patch says what it adds and where from.
#
# The binary is keyed by a hash of tools/vaultcli/{go.mod,go.sum,main.go}, the
# patches and the platform, and cached in ${EGRESSD_CACHE:-$HOME/.cache/egressd}/vaultcli/<hash>/vault,
# shared by every clone on the machine. A cached run takes milliseconds; a cold
# one downloads the modules (most shared with tools/vaultdev's, which make deps
# builds first) and compiles all of Vault's built-in plugins: README.md says
# what that costs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_ROOT=${EGRESSD_CACHE:-${HOME:-/tmp}/.cache/egressd}/vaultcli

say() { echo "install-vault-cli: $*" >&2; }
die() {
  echo "install-vault-cli: error: $*" >&2
  exit 1
}
# shellcheck source=scripts/lib/buildlock.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/buildlock.sh"

cd "$ROOT/tools/vaultcli"
bin=$(module_build "$CACHE_ROOT" "$ROOT/tools/vaultcli" vault ../vaultdev/patches/*.patch patches/*.patch)
mkdir -p "$ROOT/.cache/bin"
ln -sfn "$bin" "$ROOT/.cache/bin/vault"
echo "$bin"
