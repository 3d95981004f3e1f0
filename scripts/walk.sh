#!/usr/bin/env bash
# Counts the files of this repository one request passes through, and the moves
# between them, for the four walks of internal/proxy/walk_test.go: an explicit
# GET, a GET through an intercepted CONNECT, a spliced transparent TLS connection,
# one HTTP/2 stream in an intercepted tunnel.
#
#   scripts/walk.sh            the working tree
#   scripts/walk.sh REV        a commit, checked out in a detached worktree (removed after);
#                              the working tree's walk_test.go is copied in if REV has none
#
# The test binary is built without optimisation or inlining and run under delve's
# trace, with a tracepoint on every function of the repository's non-test packages
# (internal/testutil excepted); only calls between walkBegin and walkEnd count, and
# _test.go files never do. Printed twice: files of internal/proxy (and upstream/)
# only, and files of the whole repository. Needs dlv
# (go install github.com/go-delve/delve/cmd/dlv@latest) and unshare, like the
# package's tests. Takes a few minutes: every traced call stops the process.
# WALK_KEEP=1 keeps the trace and the function -> file map (the path is printed).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
src=$root
cleanup() {
  if [ "$src" != "$root" ]; then git -C "$root" worktree remove --force "$src"; fi
  if [ -n "${WALK_KEEP:-}" ]; then echo "trace kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
if [ $# -gt 0 ]; then
  src=$work/src
  git -C "$root" worktree add --detach --quiet "$src" "$1"
  [ -f "$src/internal/proxy/walk_test.go" ] || cp "$root/internal/proxy/walk_test.go" "$src/internal/proxy/"
fi
dlv=$(command -v dlv || echo "$(go env GOPATH)/bin/dlv")

cd "$src"
go test -c -tags walk -gcflags='all=-N -l' -o "$work/walk.test" ./internal/proxy
mod=$(go list -m)
pkgs=$(go list ./internal/... ./pkg/... | grep -v /testutil | sed 's/[.]/\\./g' | paste -sd'|')
regex="^(($pkgs)\.|${mod//./\\.}/internal/proxy_test\.walk(Begin|End)$)"

# function -> file, for every function in the binary
go tool nm "$work/walk.test" | awk '$2 == "T" || $2 == "t" { print "0x" $1 }' |
  go tool addr2line "$work/walk.test" | paste - - | awk -v root="$src/" '
    { f = $NF; sub(/:[0-9]+$/, "", f); if (index(f, root) == 1) print $1, substr(f, length(root) + 1) }' \
  > "$work/funcs"

cd internal/proxy # the tests read testdata and deploy/ relative to the package
unshare -rnm -- env EGRESSD_IN_NETNS=1 "$dlv" trace --exec "$work/walk.test" "$regex" \
  -- -test.run '^TestWalk$' -test.count 1 >"$work/out" 2>"$work/trace" ||
  { tail -20 "$work/out" "$work/trace"; exit 1; }

# Per goroutine, the traced calls in order: a call to a function in another file
# than the previous call's is a move; every file called into is a file passed
# through. Returns only keep each goroutine's stack, whose outermost function says
# whether the goroutine serves the request: only goroutines started in
# internal/proxy count (not a credential file's watcher polling meanwhile).
# scope limits the count to files under it; calls outside it are not seen at all.
count='
  FNR == NR { file[$1] = $2; next }
  # "> goroutine(7): pkg.F(args)" is a call, ">> goroutine(7): pkg.F => (results)" its return.
  /^>>? goroutine\(/ {
    g = $2; fn = $3
    if (match(fn, /[^.]\(/)) fn = substr(fn, 1, RSTART) # the arguments, not a receiver
    if (fn ~ /walk(Begin|End)$/) {
      if ($1 == ">>") next
      if (fn ~ /Begin$/) { split($0, a, "\""); walk = a[2]; delete seen; delete last; files = moves = 0 }
      else printf "%-20s %3d files %4d moves\n", walk, files, moves
      next
    }
    if (file[fn] == "" || file[fn] ~ /_test\.go$/ || index(file[fn], scope) != 1) next
    if ($1 == ">>") { # pop to the function returning (a frame may be lost to a panic)
      for (d = depth[g]; d > 0 && stack[g, d] != fn; d--) ;
      depth[g] = d > 0 ? d - 1 : 0
      next
    }
    stack[g, ++depth[g]] = fn
    if (walk == "" || file[stack[g, 1]] !~ /^internal\/proxy\//) next
    f = file[fn]
    if (!(f in seen)) { seen[f] = 1; files++ }
    if (g in last && last[g] != f) moves++
    last[g] = f
  }'
if ! grep -q '^PASS$' "$work/out" || [ "$(grep -c 'walkEnd(' "$work/trace")" != 4 ]; then
  echo "the walk test did not pass under the trace:" >&2; tail -20 "$work/out" >&2; exit 1
fi
awk -v scope=internal/proxy/ "$count" "$work/funcs" "$work/trace" > "$work/proxy"
awk -v scope= "$count" "$work/funcs" "$work/trace" > "$work/all"
printf '%-20s %-25s %s\n' walk internal/proxy/ 'whole repository'
paste "$work/proxy" "$work/all" | awk '{ printf "%-20s %3d files %4d moves   %3d files %4d moves\n", $1, $2, $4, $7, $9 }'
