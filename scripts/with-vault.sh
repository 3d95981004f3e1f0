#!/usr/bin/env bash
# Runs a command with a real Vault dev server (scripts/vaultdev.sh) started for it:
# VAULT_ADDR and VAULT_TOKEN are exported to the command, and the server is stopped
# when the command ends, whatever its result.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/vaultdev.sh start)"
trap 'scripts/vaultdev.sh stop >/dev/null 2>&1 || true' EXIT
"$@"
