#!/usr/bin/env bash
# Installs what the deploy/ tests need to render and validate the Kubernetes
# manifests and the compose file offline (deploy/kubeconform_test.go,
# deploy/helm_test.go, deploy/compose_test.go), at the versions pinned there:
#   helm         go install helm.sh/helm/v4/cmd/helm (Go module proxy)
#   kubeconform  go install github.com/yannh/kubeconform/cmd/kubeconform
#   schemas      go mod download of the Kubernetes module (its swagger.json) and
#                the Prometheus Operator module (its CRDs), into the module cache
#   docker-compose  Debian's (1.29), for `docker-compose config`
# Binaries are cached in ${EGRESSD_CACHE:-$HOME/.cache/egressd}/tools/NAME-VERSION/
# (shared by every clone) and linked into .cache/bin. Nothing is fetched when
# the pinned version is there already.
set -euo pipefail
cd "$(dirname "$0")/.."
pins=$PWD/deploy/kubeconform_test.go
pin() {
  local v
  v=$(sed -n "s/^[[:space:]]*$1[[:space:]]*= \"\(.*\)\"$/\1/p" "$pins")
  [ -n "$v" ] || { echo "install-deploy-deps: no $1 in $pins" >&2; exit 1; }
  echo "$v"
}
cache=${EGRESSD_CACHE:-${HOME:-/tmp}/.cache/egressd}/tools
mkdir -p "$cache" .cache/bin

# tool NAME PACKAGE VERSION: go install PACKAGE@VERSION unless cached.
tool() {
  local dir=$cache/$1-$3
  if [ ! -x "$dir/$1" ]; then
    echo "install-deploy-deps: go install $2@$3" >&2
    GOBIN=$dir.tmp GOFLAGS= go install "$2@$3"
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
  fi
  ln -sfn "$dir/$1" ".cache/bin/$1"
}
tool helm helm.sh/helm/v4/cmd/helm "$(pin helmVersion)"
tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$(pin kubeconformVersion)"

# The schema sources: a no-op when the module cache has them.
(cd "$cache" && GOFLAGS=-mod=mod go mod download "$(pin kubernetesModule)" "$(pin prometheusOperatorMod)")

if ! command -v docker-compose >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deploy-deps: need docker-compose (run as root or apt-get install docker-compose)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi
