#!/usr/bin/env bash
# docker-build-check.sh: what can be checked of the Dockerfiles without a Docker engine.
#
# For each Dockerfile it runs the line after "# BUILD: <name>" (the same `go build`, flags and
# env as the image) on the host, with the ARG defaults substituted and /out pointed at a temp
# directory, and then checks the binary the final stage expects:
#   - manager: statically linked (the final stage is distroless/static, no libc);
#   - cgo binaries: every shared library they need directly is one the final stage installs
#     (libc6 is in debian-slim, libzmq5 is installed by apt-get).
# For the manager it also checks that the Dockerfile's COPY lines cover every package of this
# module the binary imports (the manager image copies only part of the tree).
#
# It cannot check, and says so at the end: that base images exist and pull, that apt-get in the
# image finds the packages, the image's file layout beyond the manager's COPY list, USER and
# ENTRYPOINT at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail=0
note() { printf '%s\n' "$*"; }
bad() { printf 'FAIL: %s\n' "$*"; fail=1; }

# build_line FILE NAME: the RUN line after "# BUILD: NAME", ARGs substituted for the host.
build_line() {
	local file=$1 name=$2
	awk -v n="# BUILD: $name" 'found { sub(/^RUN /, ""); print; exit } $0 == n { found = 1 }' "$file" |
		sed -e "s|\${TARGETOS}|$(go env GOOS)|g" -e "s|\${TARGETARCH}|$(go env GOARCH)|g" -e "s|/out/|$out/|g" \
			-e "s|\${VERSION}|dev|g" -e "s|\${COMMIT}||g" -e "s|\${BUILD_DATE}||g"
}

check_one() {
	local file=$1 name=$2 pkg=$3
	if [ ! -d "$pkg" ]; then
		bad "$file: $pkg does not exist yet, so $name was not built"
		return
	fi
	local line
	line=$(build_line "$file" "$name")
	if [ -z "$line" ]; then
		bad "$file: no RUN line after '# BUILD: $name'"
		return
	fi
	note "== $file: $line"
	if ! bash -c "$line"; then
		bad "$file: the build line failed"
		return
	fi
	case "$name" in
	manager)
		if readelf -d "$out/$name" 2>/dev/null | grep -q NEEDED; then
			bad "$name is dynamically linked; distroless/static has no libc"
		else
			note "ok: $name is static"
		fi
		;;
	*)
		local needed missing=0
		needed=$(readelf -d "$out/$name" | awk '/NEEDED/ { gsub(/[\[\]]/, "", $NF); print $NF }')
		for lib in $needed; do
			case "$lib" in
			libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | libresolv.so.* | ld-linux*) ;; # libc6, in debian-slim
			libzmq.so.5) grep -q 'libzmq5' "$file" || { bad "$name needs $lib but $file does not install libzmq5"; missing=1; } ;;
			*) bad "$name needs $lib, which $file's final stage does not install"; missing=1 ;;
			esac
		done
		[ "$missing" = 0 ] && note "ok: $name needs only $(echo $needed | tr ' ' ',') — all in its final stage"
		;;
	esac
}

# The manager image copies a subset of the tree: every imported package of this module must be in it.
check_manager_copy() {
	local mod copies missing=0
	mod=$(go list -m)
	copies=$(awk '/^COPY / && $2 !~ /^--/ && $2 != "go.mod" { print $2 }' Dockerfile)
	for dir in $(go list -deps -f '{{if .Module}}{{if eq .Module.Path "'"$mod"'"}}{{.Dir}}{{end}}{{end}}' ./cmd/manager); do
		rel=${dir#"$PWD"/}
		ok=0
		for c in $copies; do case "$rel/" in "$c"*) ok=1 ;; esac; done
		[ "$ok" = 1 ] || { bad "Dockerfile does not COPY $rel, which ./cmd/manager imports"; missing=1; }
	done
	[ "$missing" = 0 ] && note "ok: Dockerfile's COPY lines cover every package ./cmd/manager imports"
}

check_one Dockerfile manager ./cmd/manager
check_manager_copy
check_one Dockerfile.kvrouter kvrouter ./cmd/kvrouter
check_one Dockerfile.vllm-sim vllm-sim ./cmd/vllm-sim

cat <<'NOTE'

Not checked here (no Docker engine): that golang:1.26-bookworm, gcr.io/distroless/static-debian12
and debian:bookworm-slim pull; that apt-get finds libzmq3-dev/libzmq5 in the image; the file
layout of the kvrouter and vllm-sim images (they COPY the whole context, minus .dockerignore);
that USER 65532 can run the ENTRYPOINT. Build the images with `make docker-build` where Docker runs,
or without Docker with `make images` (same build lines, labels, user and entrypoint, on scratch
layers; `make test-images` runs them under chroot).
NOTE
exit "$fail"
