#!/usr/bin/env bash
# debian-runtime.sh DEST PKG...: unpacks PKG and every package it depends on (recursively,
# Depends/PreDepends only, as apt-cache resolves them on this host) into DEST, a root file system
# for a scratch image layer. The packages are the build host's own Debian release and
# architecture, fetched with `apt-get download` (cached by release, arch and version) and
# unpacked with `dpkg-deb -x`; no maintainer scripts run. Documentation is left out, as in
# debian-slim. DEST/usr/share/kvroute/runtime-packages lists name=version of what is in it.
#
# Env: KVROUTE_DEB_NO_DEPS=1 (only the named packages), KVROUTE_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/kvroute)
set -euo pipefail
dest=$1; shift
[ $# -gt 0 ] || { echo "usage: $0 DEST PKG..." >&2; exit 2; }
log() { echo "debian-runtime: $*" >&2; }

command -v apt-cache >/dev/null && command -v dpkg-deb >/dev/null ||
	{ log "needs a Debian host (apt-cache, apt-get, dpkg-deb)"; exit 1; }
# Lists are needed to resolve and download; a fresh machine or CI may not have them yet.
if ! apt-cache show "$1" >/dev/null 2>&1 || [ -z "$(apt-cache policy "$1" | sed -n 's/^ *Candidate: //p' | grep -v none)" ]; then
	if [ "$(id -u)" = 0 ]; then
		log "apt lists lack $1; running apt-get update"
		apt-get update -qq
	else
		log "apt lists lack $1: run 'apt-get update' as root"; exit 1
	fi
fi

. /etc/os-release
arch=$(dpkg --print-architecture)
cache=${KVROUTE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvroute}/debs/${ID}-${VERSION_ID:-sid}-${arch}
mkdir -p "$cache"

# Names only; <virtual> entries are satisfied by a real package that the recursion lists too.
# KVROUTE_DEB_NO_DEPS=1 takes the named packages alone (e.g. ca-certificates, for its files).
if [ -n "${KVROUTE_DEB_NO_DEPS:-}" ]; then pkgs=("$@"); else mapfile -t pkgs < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
	--no-breaks --no-replaces --no-enhances "$@" | grep -E '^[a-z0-9]' | sed 's/:.*//' | sort -u); fi

# One apt-cache call for every candidate version (one call per package takes a second each).
declare -A cand
while read -r name ver; do cand[$name]=$ver; done < <(apt-cache policy "${pkgs[@]}" |
	awk '/^[^ ]/ { sub(/:$/, "", $1); sub(/:.*/, "", $1); n = $1 } /^ *Candidate:/ { print n, $2 }')
# As root, apt drops to _apt to download, which cannot write to root's cache.
dl_opts=(-q); [ "$(id -u)" = 0 ] && dl_opts+=(-o APT::Sandbox::User=root)

# One downloader at a time per cache (make images and the tests may run together).
if command -v flock >/dev/null 2>&1; then
	exec 8>"$cache/.lock"
	flock 8
fi

rm -rf "$dest"; mkdir -p "$dest/usr/share/kvroute"
: >"$dest/usr/share/kvroute/runtime-packages"
for p in "${pkgs[@]}"; do
	ver=${cand[$p]:-}
	[ -n "$ver" ] && [ "$ver" != "(none)" ] || { log "no candidate version of $p"; exit 1; }
	# apt-get download names files with the epoch's colon escaped as %3a.
	deb=$(ls "$cache/${p}_${ver/:/%3a}_"*.deb 2>/dev/null | head -n1 || true)
	if [ -z "$deb" ]; then
		(cd "$cache" && apt-get download "${dl_opts[@]}" "$p=$ver" >/dev/null) || { log "apt-get download $p=$ver failed"; exit 1; }
		deb=$(ls "$cache/${p}_${ver/:/%3a}_"*.deb | head -n1)
	fi
	dpkg-deb -x "$deb" "$dest"
	echo "$p=$ver" >>"$dest/usr/share/kvroute/runtime-packages"
done
rm -rf "$dest"/usr/share/{doc,man,info,lintian,linda,locale} "$dest"/usr/share/doc-base
log "${#pkgs[@]} packages from ${PRETTY_NAME:-$ID} ($arch) in $dest: ${pkgs[*]}"
