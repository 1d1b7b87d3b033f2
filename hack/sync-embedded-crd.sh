#!/usr/bin/env bash
# Copies the generated CRDs next to the Go package that embeds them: go:embed cannot reach
# config/ from api/, and `kvroutectl render` validates with the very schema the cluster gets.
# A test (api/v1alpha1/crd) fails when the two copies differ, so run `make manifests`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/config/crd/bases"
dst="$root/api/v1alpha1/crd"
mkdir -p "$dst"
rm -f "$dst"/*.yaml
cp "$src"/*.yaml "$dst"/
