#!/usr/bin/env bash
# Installs the npm packages the real-client suite (test/clients) runs, pinned, into
# the git-ignored .cache/node/node_modules (make's CACHE), from the npm registry.
# Nothing is fetched when the pinned version is there already. Without node or
# npm it says so and leaves the Node cases to skip (make test fails them:
# EGRESSD_REQUIRE_CLIENTS).
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${1:-.cache}
# The pin lives beside the test that uses it (test/clients/tools_test.go).
undici=$(sed -n 's/^const undiciVersion = "\(.*\)"$/\1/p' test/clients/tools_test.go)
[ -n "$undici" ] || { echo "install-client-deps: no undiciVersion in test/clients/tools_test.go" >&2; exit 1; }
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "install-client-deps: node or npm missing; the Node client cases cannot run" >&2
  exit 0
fi
mkdir -p "$cache/node"
dir=$(cd "$cache/node" && pwd)
have=$(node -p 'require(process.argv[1]).version' "$dir/node_modules/undici/package.json" 2>/dev/null || true)
if [ "$have" != "$undici" ]; then
  npm install --prefix "$dir" --no-audit --no-fund --no-save --no-package-lock --loglevel=error \
    "undici@$undici" >/dev/null
fi
