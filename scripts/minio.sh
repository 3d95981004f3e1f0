#!/usr/bin/env bash
# A real S3 server for egressd's aws tests (test/aws): MinIO, which verifies every
# SigV4 signature and implements STS AssumeRole for its root user, built from the Go
# module proxy with `go install` (no prebuilt download) at the pinned version below.
#
#   scripts/minio.sh build   build the binary unless cached; print its path
#   scripts/minio.sh path    print the cached binary's path; fail when not built
#
# The binary is cached in ${EGRESSD_CACHE:-$HOME/.cache/egressd}/minio/<version>/ so
# every clone on the machine shares it. A cold build downloads ~1 GB of modules and
# compiles for several minutes on 2 CPUs; a cached `build` takes milliseconds.
# MinIO is AGPL: it is a test fixture run as a separate program, never linked.
set -euo pipefail

# MINIO_VERSION: RELEASE tags are not semver, so the module proxy knows MinIO by
# pseudo-versions; this one (February 2026) builds with Go 1.26.
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
CACHE_ROOT=${EGRESSD_CACHE:-${HOME:-/tmp}/.cache/egressd}/minio

say() { echo "minio: $*" >&2; }
die() {
  echo "minio: error: $*" >&2
  exit 1
}
# shellcheck source=scripts/lib/buildlock.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/buildlock.sh"

cmd_build() {
  local dir=$CACHE_ROOT/$MINIO_VERSION t0 work
  if [ -x "$dir/minio" ]; then
    echo "$dir/minio"
    return
  fi
  command -v go >/dev/null 2>&1 || die "go is not on PATH"
  mkdir -p "$CACHE_ROOT" || die "cannot create $CACHE_ROOT (set EGRESSD_CACHE)"
  build_lock "$CACHE_ROOT" "$MINIO_VERSION"
  if [ ! -x "$dir/minio" ]; then
    t0=$(date +%s)
    work=$(mktemp -d "$CACHE_ROOT/.build-XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" EXIT
    say "building MinIO $MINIO_VERSION (cold: several minutes)"
    GOBIN=$work GOFLAGS=-buildvcs=false CGO_ENABLED=0 go install -trimpath -ldflags='-s -w' \
      "github.com/minio/minio@$MINIO_VERSION" >&2 || die "go install failed (needs the Go module proxy: $(go env GOPROXY))"
    mkdir -p "$dir"
    mv "$work/minio" "$dir/minio"
    rm -rf "$work"
    trap - EXIT
    say "built $dir/minio in $(($(date +%s) - t0))s"
  fi
  build_unlock
  echo "$dir/minio"
}

case "${1:-}" in
build) cmd_build ;;
path)
  [ -x "$CACHE_ROOT/$MINIO_VERSION/minio" ] || die "not built (scripts/minio.sh build)"
  echo "$CACHE_ROOT/$MINIO_VERSION/minio"
  ;;
*)
  echo "usage: $0 build" >&2
  exit 2
  ;;
esac
