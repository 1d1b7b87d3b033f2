#!/usr/bin/env bash
# Builds the envtest control plane (kube-apiserver, etcd) from the Go module proxy and caches it
# by version in the user's cache directory, so every clone on this machine reuses one build.
# Prebuilt envtest tarballs cannot be downloaded here; the module proxy can be reached.
#
# Usage: hack/envtest-assets.sh        -> prints the directory holding the binaries
# Env:   KUBE_VERSION (1.37.2), ETCD_VERSION (3.6.16), KVROUTE_CACHE_DIR (default
#        ${XDG_CACHE_HOME:-$HOME/.cache}/kvroute)
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
STAGING_VERSION="0.${KUBE_VERSION#1.}"
CACHE_ROOT=${KVROUTE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvroute}
DEST="$CACHE_ROOT/envtest/k8s-${KUBE_VERSION}-etcd-${ETCD_VERSION}"

log() { echo "envtest-assets: $*" >&2; }

mkdir -p "$DEST"
if [ -x "$DEST/kube-apiserver" ] && [ -x "$DEST/etcd" ] && [ -e "$DEST/kubectl" ]; then
  echo "$DEST"
  exit 0
fi

# One build at a time: concurrent callers (parallel test packages, several clones) wait for the
# first one instead of each compiling kube-apiserver into the same .tmp file.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$DEST/.lock"
  if ! flock -n 9; then
    log "another build is running; waiting for it"
    flock 9
  fi
  if [ -x "$DEST/kube-apiserver" ] && [ -x "$DEST/etcd" ] && [ -e "$DEST/kubectl" ]; then
    echo "$DEST"
    exit 0
  fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ ! -x "$DEST/kube-apiserver" ]; then
  log "building kube-apiserver v${KUBE_VERSION} from the module proxy (several minutes, once)"
  modfile=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v${KUBE_VERSION}" \
    | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [ -n "$modfile" ] || { log "could not fetch k8s.io/kubernetes v${KUBE_VERSION}"; exit 1; }
  mkdir -p "$work/apiserver"
  {
    echo "module kvroute.local/envtest-apiserver"
    echo
    grep '^go ' "$modfile"
    echo
    echo "require k8s.io/kubernetes v${KUBE_VERSION}"
    echo
    echo "replace ("
    # Every staging module k8s.io/kubernetes replaces with ./staging/... is published as v0.x.
    grep -E '=> \./staging/' "$modfile" | awk -v v="v${STAGING_VERSION}" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } > "$work/apiserver/go.mod"
  cat > "$work/apiserver/tools.go" <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
  (cd "$work/apiserver" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true
   # Stamp the version the way Kubernetes' own build does, so /version reports v1.37.2.
   vpkg=k8s.io/component-base/version
   ldflags="-X $vpkg.gitVersion=v${KUBE_VERSION} -X $vpkg.gitMajor=${KUBE_VERSION%%.*}"
   minor=${KUBE_VERSION#*.}; ldflags="$ldflags -X $vpkg.gitMinor=${minor%%.*} -X $vpkg.gitTreeState=clean"
   cd "$work/apiserver" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
     -o "$DEST/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
  mv "$DEST/kube-apiserver.tmp" "$DEST/kube-apiserver"
fi

if [ ! -x "$DEST/etcd" ]; then
  log "building etcd v${ETCD_VERSION} from the module proxy"
  mkdir -p "$work/etcd"
  (cd "$work/etcd" && go mod init kvroute.local/envtest-etcd >/dev/null 2>&1 \
    && GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" >/dev/null 2>&1 \
    && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$DEST/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$DEST/etcd.tmp" "$DEST/etcd"
fi

if [ ! -e "$DEST/kubectl" ]; then
  kc=$(command -v kubectl || true)
  [ -n "$kc" ] || { log "kubectl not found on PATH (install it, e.g. Debian's kubectl package)"; exit 1; }
  ln -sf "$kc" "$DEST/kubectl"
fi

echo "$DEST"
