# Shared by the scripts that cache binaries under ${EGRESSD_CACHE:-$HOME/.cache/egressd}
# (vaultdev.sh, install-vault-cli.sh, peers.sh, minio.sh). Source it after defining say
# and die.

# build_lock ROOT KEY: wait until no other build of KEY runs under ROOT (across
# clones and concurrent runs; fd 9 holds the lock until build_unlock), and
# remove the scratch dirs of builds that were killed (SIGKILL skips their trap).
build_lock() {
  exec 9>"$1/.lock-$2"
  if command -v flock >/dev/null 2>&1; then
    flock -n 9 || {
      say "another build of $2 is running; waiting for it"
      flock 9
    }
  fi
  find "$1" -maxdepth 1 -name '.build-*' -mmin +180 -exec rm -rf {} + 2>/dev/null || true
}

build_unlock() { exec 9>&-; }

# module_key SRC [PATCH...]: a hash of what decides a binary built from the small
# module in SRC (its go.mod, go.sum and main.go, the patches) and of the platform.
module_key() {
  local src=$1 f
  shift
  (
    cd "$src"
    for f in go.mod go.sum main.go "$@"; do
      [ -f "$f" ] || die "missing $src/$f"
      printf '== %s\n' "$f"
      cat "$f"
    done
    uname -sm
  ) | sha256sum | cut -c1-16
}

# module_build ROOT SRC BIN [PATCH...]: print ROOT/<module_key>/BIN, building SRC's
# main package into it first unless it is there; one build per key at a time,
# across clones. PATCH files (relative to SRC) are applied to the vendored
# modules (`go mod vendor`, then patch -p1 from the module root) before the build.
# Every module is checked against SRC's go.sum.
module_build() {
  local root=$1 src=$2 bin=$3 key dir
  shift 3
  key=$(module_key "$src" "$@")
  dir=$root/$key
  if [ ! -x "$dir/$bin" ]; then
    command -v go >/dev/null 2>&1 || die "go is not on PATH ($src needs Go $(awk '/^go /{print $2}' "$src/go.mod") or newer)"
    mkdir -p "$root" || die "cannot create $root (set EGRESSD_CACHE)"
    build_lock "$root" "$key"
    [ -x "$dir/$bin" ] || module_build_into "$dir" "$src" "$bin" "$@"
    build_unlock
  fi
  [ -x "$dir/$bin" ] || die "build finished but $dir/$bin is missing"
  echo "$dir/$bin"
}

module_build_into() { # DIR SRC BIN [PATCH...]
  local dir=$1 src=$2 bin=$3 work t0 p mode=readonly
  shift 3
  work=$(mktemp -d "$(dirname "$dir")/.build-XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  t0=$(date +%s)
  cp "$src/go.mod" "$src/go.sum" "$src/main.go" "$work/"
  say "building $bin (key $(basename "$dir")) in $work; cold: minutes, and the modules' download"
  if [ $# -gt 0 ]; then
    need_patch
    (cd "$work" && GOFLAGS='-mod=readonly -buildvcs=false' go mod vendor >&2) ||
      die "go mod vendor failed (needs the Go module proxy: $(go env GOPROXY))"
    for p in "$@"; do
      (cd "$work" && patch -p1 --forward --batch --quiet <"$src/$p" >&2) ||
        die "patch $p did not apply to the vendored modules (did go.mod change?)"
    done
    mode=vendor
  fi
  (cd "$work" && GOFLAGS="-mod=$mode -buildvcs=false" CGO_ENABLED=0 \
    go build -trimpath -ldflags='-s -w' -o "$work/$bin" . >&2) ||
    die "go build failed (a cold build needs the Go module proxy: $(go env GOPROXY))"
  mkdir -p "$dir"
  mv "$work/$bin" "$dir/$bin.tmp"
  mv "$dir/$bin.tmp" "$dir/$bin"
  rm -rf "$work"
  trap - EXIT
  say "built $dir/$bin in $(($(date +%s) - t0))s"
}

# need_patch: install Debian's patch as root when it is missing.
need_patch() {
  command -v patch >/dev/null 2>&1 && return
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing Debian package 'patch'"
    apt-get update -qq >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patch >/dev/null || die "apt-get install patch failed"
  else
    die "'patch' is not installed (Debian: apt-get install patch)"
  fi
}
