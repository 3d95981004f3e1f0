#!/usr/bin/env bash
# Runs every Go fuzz target in the module for the given time each (default 30s).
#
# FUZZMINIMIZETIME (default 5s) bounds how long a worker minimises each new
# interesting input. Go's default, 60s, lets a target with large inputs (a TLS
# ClientHello) spend a whole short run minimising instead of fuzzing; crashers
# are still written to testdata/fuzz, minimised within the same bound.
set -euo pipefail
t=${1:-30s}
m=${FUZZMINIMIZETIME:-5s}
for pkg in $(go list ./...); do
  for f in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    echo "== $pkg $f ($t)"
    go test -run='^$' -fuzz="^$f\$" -fuzztime="$t" -fuzzminimizetime="$m" "$pkg"
  done
done
