#!/usr/bin/env bash
# Runs a command with a real Vault dev server (scripts/vaultdev.sh) started for it:
# VAULT_ADDR and VAULT_TOKEN are exported to the command, and the server is stopped
# when the command ends, whatever its result.
set -euo pipefail
cd "$(dirname "$0")/.."
# An assignment, not eval "$(...)": a failed start must stop here, not run the
# command without VAULT_ADDR.
env_lines=$(scripts/vaultdev.sh start)
eval "$env_lines"
trap 'scripts/vaultdev.sh stop >/dev/null 2>&1 || true' EXIT
"$@"
