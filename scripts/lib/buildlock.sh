# Shared by scripts/vaultdev.sh and scripts/peers.sh, which cache binaries
# under ${EGRESSD_CACHE:-$HOME/.cache/egressd}. Source it after defining say.

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
