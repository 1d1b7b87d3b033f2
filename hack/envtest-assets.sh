#!/usr/bin/env bash
# Prints a directory holding the envtest control plane (kube-apiserver, etcd, kubectl) for
# KUBEBUILDER_ASSETS, fetching or building it once and caching it in the user's cache directory,
# so every clone on this machine reuses it.
#
# 1. Fast path (seconds on a connected machine): the published envtest archive, found the way
#    controller-runtime's setup-envtest finds it: the release index ENVTEST_INDEX_URL (YAML,
#    releases.<version>.envtest-<version>-<os>-<arch>.tar.gz.{hash,selfLink}), the archive from
#    its selfLink, checked against the index's SHA-512 before anything is unpacked.
# 2. Fallback (about 7 minutes on two idle cores, 20 on a busy machine): kube-apiserver and etcd
#    built from the Go module proxy, when the index or archive cannot be fetched (no network
#    beyond the module proxy, a version the index lacks, a checksum mismatch). A machine that
#    cannot reach the index decides within ENVTEST_CONNECT_TIMEOUT seconds.
#
# Usage: hack/envtest-assets.sh        -> prints the directory holding the binaries
# Env:   KUBE_VERSION (1.37.2), ETCD_VERSION (3.6.16, for the build), KVROUTE_CACHE_DIR (default
#        ${XDG_CACHE_HOME:-$HOME/.cache}/kvroute), ENVTEST_INDEX_URL, ENVTEST_CONNECT_TIMEOUT (5),
#        ENVTEST_DOWNLOAD=0 (skip the fast path), ENVTEST_BUILD=0 (fail instead of building)
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
STAGING_VERSION="0.${KUBE_VERSION#1.}"
CACHE_ROOT=${KVROUTE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvroute}
DEST="$CACHE_ROOT/envtest/k8s-${KUBE_VERSION}-etcd-${ETCD_VERSION}"

# The published archive's directory: its etcd is whichever the envtest release ships.
DL_DEST="$CACHE_ROOT/envtest/k8s-${KUBE_VERSION}-published"
ENVTEST_INDEX_URL=${ENVTEST_INDEX_URL:-https://raw.githubusercontent.com/kubernetes-sigs/controller-tools/HEAD/envtest-releases.yaml}
ENVTEST_CONNECT_TIMEOUT=${ENVTEST_CONNECT_TIMEOUT:-5}

log() { echo "envtest-assets: $*" >&2; }
complete() { [ -x "$1/kube-apiserver" ] && [ -x "$1/etcd" ] && [ -e "$1/kubectl" ]; }

for d in "$DL_DEST" "$DEST"; do
  if complete "$d"; then
    echo "$d"
    exit 0
  fi
done
mkdir -p "$DEST"

# download: the fast path. Returns non-zero (and says why) when the archive cannot be had.
download() {
  [ "${ENVTEST_DOWNLOAD:-1}" != 0 ] || { log "ENVTEST_DOWNLOAD=0: not downloading"; return 1; }
  command -v curl >/dev/null 2>&1 || { log "no curl: not downloading"; return 1; }
  local os arch name idx hash link tmp
  os=$(go env GOOS); arch=$(go env GOARCH)
  name="envtest-v${KUBE_VERSION}-${os}-${arch}.tar.gz"
  tmp=$(mktemp -d)
  idx="$tmp/index.yaml"
  if ! curl -fsSL --connect-timeout "$ENVTEST_CONNECT_TIMEOUT" --max-time 30 -o "$idx" "$ENVTEST_INDEX_URL" 2>"$tmp/err"; then
    log "envtest index not reachable ($(tail -n1 "$tmp/err")); building instead"
    rm -rf "$tmp"; return 1
  fi
  # The entry under the archive's name: its hash: and selfLink: lines.
  read -r hash link < <(awk -v n="$name:" '
    $1 == n { found = 1; next }
    found && $1 == "hash:" { h = $2 }
    found && $1 == "selfLink:" { l = $2 }
    found && h != "" && l != "" { print h, l; exit }' "$idx") || true
  if [ -z "${hash:-}" ] || [ -z "${link:-}" ]; then
    log "the envtest index has no $name; building instead"
    rm -rf "$tmp"; return 1
  fi
  log "downloading $name"
  if ! curl -fsSL --connect-timeout "$ENVTEST_CONNECT_TIMEOUT" --max-time 300 -o "$tmp/$name" "$link" 2>"$tmp/err"; then
    log "download failed ($(tail -n1 "$tmp/err")); building instead"
    rm -rf "$tmp"; return 1
  fi
  if [ "$(sha512sum "$tmp/$name" | cut -d' ' -f1)" != "$hash" ]; then
    log "SHA-512 of $name does not match the index; discarding it and building instead"
    rm -rf "$tmp"; return 1
  fi
  mkdir -p "$tmp/x" "$DL_DEST"
  tar -xzf "$tmp/$name" -C "$tmp/x"
  local b
  for b in kube-apiserver etcd kubectl; do
    f=$(find "$tmp/x" -type f -name "$b" | head -n1)
    [ -n "$f" ] || { log "$name has no $b; building instead"; rm -rf "$tmp"; return 1; }
    install -m 0755 "$f" "$DL_DEST/$b.tmp"
  done
  for b in kube-apiserver etcd kubectl; do mv "$DL_DEST/$b.tmp" "$DL_DEST/$b"; done
  rm -rf "$tmp"
  log "verified (SHA-512) and unpacked into $DL_DEST"
}

# One build at a time: concurrent callers (parallel test packages, several clones) wait for the
# first one instead of each compiling kube-apiserver into the same .tmp file.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$DEST/.lock"
  if ! flock -n 9; then
    log "another build is running; waiting for it"
    flock 9
  fi
  for d in "$DL_DEST" "$DEST"; do
    if complete "$d"; then
      echo "$d"
      exit 0
    fi
  done
fi

if download; then
  echo "$DL_DEST"
  exit 0
fi
[ "${ENVTEST_BUILD:-1}" != 0 ] || { log "ENVTEST_BUILD=0: not building"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# progress LABEL CMD...: runs a `go build -v ...` command, printing every ENVTEST_PROGRESS_EVERY
# seconds (20) how long it has run and how many packages it has compiled, so a first run that
# builds for minutes does not look hung. The command's output is shown only if it fails.
progress() {
  local label=$1; shift
  local out="$work/progress.$$" start=$SECONDS pid rc
  "$@" >"$out" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for ((i = 0; i < ${ENVTEST_PROGRESS_EVERY:-20} * 5; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -0 "$pid" 2>/dev/null || break
    log "$label: $((SECONDS - start))s, $(grep -cv '^#' "$out" || true) packages compiled"
  done
  rc=0; wait "$pid" || rc=$?
  if [ "$rc" -ne 0 ]; then
    grep -v '^[a-z0-9._/-]*$' "$out" >&2 || cat "$out" >&2
    return "$rc"
  fi
  log "$label: done in $((SECONDS - start))s"
}

if [ ! -x "$DEST/kube-apiserver" ]; then
  log "building kube-apiserver v${KUBE_VERSION} from the module proxy (about 7 minutes on two idle cores, longer on a busy machine; once)"
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
   cd "$work/apiserver" && GOFLAGS=-mod=mod CGO_ENABLED=0 progress "kube-apiserver" go build -v -trimpath -ldflags "$ldflags" \
     -o "$DEST/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
  mv "$DEST/kube-apiserver.tmp" "$DEST/kube-apiserver"
fi

if [ ! -x "$DEST/etcd" ]; then
  log "building etcd v${ETCD_VERSION} from the module proxy"
  mkdir -p "$work/etcd"
  (cd "$work/etcd" && go mod init kvroute.local/envtest-etcd >/dev/null 2>&1 \
    && GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" >/dev/null 2>&1 \
    && GOFLAGS=-mod=mod CGO_ENABLED=0 progress "etcd" go build -v -trimpath -o "$DEST/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$DEST/etcd.tmp" "$DEST/etcd"
fi

if [ ! -e "$DEST/kubectl" ]; then
  kc=$(command -v kubectl || true)
  [ -n "$kc" ] || { log "kubectl not found on PATH (install it, e.g. Debian's kubectl package)"; exit 1; }
  ln -sf "$kc" "$DEST/kubectl"
fi

echo "$DEST"
