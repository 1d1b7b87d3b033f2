#!/usr/bin/env bash
# bundle.sh RENDERED: writes bundle/ (OLM registry+v1) from `kustomize build config/manifests`.
# operator-sdk is not available offline, so test/ship/olmbundle does its `generate bundle` step;
# test/ship validates the result with operator-framework/api's validators.
set -euo pipefail
cd "$(dirname "$0")/.."
rendered=${1:?usage: hack/bundle.sh RENDERED (kustomize build config/manifests output)}
VERSION=${VERSION:?VERSION (e.g. 0.1.0) is required}
go run ./test/ship/olmbundle/cmd/bundlegen -rendered "$rendered" -icon config/manifests/icon.svg -version "$VERSION" -out bundle
echo "bundle: wrote bundle/ for kvroute v$VERSION"
