#!/usr/bin/env bash
# Runs every native Go fuzz target in the module for FUZZTIME each (go test allows one -fuzz
# target per package run, so this loops). The seed corpora also run in plain `go test`.
set -euo pipefail
FUZZTIME=${FUZZTIME:-5s}
cd "$(dirname "$0")/.."
grep -rl --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' . | sort | while read -r file; do
  pkg="./$(dirname "${file#./}")"
  for target in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$file" | sed 's/^func //'); do
    echo "fuzz: $pkg $target for $FUZZTIME"
    go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" "$pkg"
  done
done
