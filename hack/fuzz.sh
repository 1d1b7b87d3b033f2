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
    # A target whose inputs are slow (FuzzRender validates through CEL) can end with Go's
    # "context deadline exceeded" when the time runs out mid-input, with no failing input: that
    # is retried once. A real finding writes its input under testdata/fuzz and fails at once.
    if ! out=$(go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" "$pkg" 2>&1); then
      echo "$out"
      if grep -q 'context deadline exceeded' <<<"$out" && ! grep -q 'Failing input written' <<<"$out"; then
        echo "fuzz: $target ran out of time mid-input, no failing input; once more"
        go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" "$pkg"
      else
        exit 1
      fi
    else
      echo "$out"
    fi
  done
done
