#!/usr/bin/env bash
# make images: OCI image tarballs of the manager, kvrouter, vllm-sim and the OLM bundle, built
# without a Docker engine or a registry (hack/ociimage assembles scratch layers).
#
# What goes in each image is read from its Dockerfile, which stays the description for users
# with Docker: the `go build` line after "# BUILD: <name>", the LABELs (with ${VERSION}), USER,
# ENTRYPOINT and the COPY --from=build destination. The base is not pulled: it is made of
#   - base:    /etc/passwd and /etc/group (root, nonroot 65532), /etc/nsswitch.conf, /tmp, and
#              /etc/ssl/certs/ca-certificates.crt from Debian's ca-certificates package;
#   - runtime: (kvrouter, vllm-sim) libzmq5 and its 16 dependencies incl. libc6 and its loader,
#              unpacked from this host's Debian release (hack/debian-runtime.sh);
#   - the binary, and the final stage's `RUN ln -s TARGET LINK` lines as symlinks (vllm-sim's
#     /usr/local/bin/vllm, which the rendered engine command `vllm serve` runs).
# The bundle image is bundle.Dockerfile's: bundle/{manifests,metadata,tests/scorecard} + LABELs.
#
# Env: VERSION (v0.1.0), IMAGE_REPO (ghcr.io/kvroute), IMAGES_OUT (bin/images),
#      COMMIT and BUILD_DATE (the checkout's HEAD and its commit time; stamped with VERSION),
#      IMAGES (manager kvrouter vllm-sim bundle), SOURCE_DATE_EPOCH (0).
# Builds for this host's architecture (cgo); the release workflow runs it on amd64 and arm64.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${VERSION:-v0.1.0}
IMAGE_REPO=${IMAGE_REPO:-ghcr.io/kvroute}
OUT=${IMAGES_OUT:-bin/images}
IMAGES=${IMAGES:-manager kvrouter vllm-sim bundle}
GO=${GO:-go}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
# What the binaries' --version says besides VERSION: the checkout's commit and its time (not the
# build's, so the same commit builds the same bytes).
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || true)}
BUILD_DATE=${BUILD_DATE:-$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || true)}
log() { echo "images: $*" >&2; }
start=$(date +%s)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT" "$work/out"
arch=$($GO env GOARCH)

# df FILE: the Dockerfile with continuation lines joined.
df() { sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$1"; }
# labels FILE: --label KEY=VALUE arguments from the LABEL lines of the final stage.
labels() {
	df "$1" | awk '/^FROM /{buf=""} /^LABEL /{buf = buf substr($0, 7) "\n"} END{printf "%s", buf}' |
		grep -oE '[A-Za-z0-9._-]+=("[^"]*"|[^ "]+)' | sed -e 's/="\(.*\)"$/=\1/' -e "s|\${VERSION}|$VERSION|g" |
		while IFS= read -r l; do printf -- '--label\0%s\0' "$l"; done
}
# last FILE KEYWORD: the argument of the last KEYWORD line (the final stage's).
last() { df "$1" | awk -v k="$2" '$1 == k { $1 = ""; v = substr($0, 2) } END { print v }'; }
# links FILE DIR: the final stage's `RUN ln -s TARGET LINK` lines, made as symlinks under DIR.
links() {
	df "$1" | awk '/^FROM /{buf=""} $1 == "RUN" && $2 == "ln" && $3 == "-s" && NF == 5 {buf = buf $4 " " $5 "\n"} END{printf "%s", buf}' |
		while read -r target link; do
			mkdir -p "$2$(dirname "$link")"
			ln -s "$target" "$2$link"
		done
}
# build FILE NAME: run the Dockerfile's build line with /out/ in a temp dir.
build() {
	local line
	line=$(awk -v n="# BUILD: $2" 'f { sub(/^RUN /, ""); print; exit } $0 == n { f = 1 }' "$1" |
		sed -e "s|\${TARGETOS}|linux|g" -e "s|\${TARGETARCH}|$arch|g" -e "s|/out/|$work/out/|g" \
			-e "s|\${VERSION}|$VERSION|g" -e "s|\${COMMIT}|$COMMIT|g" -e "s|\${BUILD_DATE}|$BUILD_DATE|g")
	[ -n "$line" ] || { log "$1 has no '# BUILD: $2' line"; exit 1; }
	log "go build $2 ($1)"
	GO="$GO" bash -c "$line"
}

base=$work/base
hack/image-base.sh "$base"

need_runtime=0
for i in $IMAGES; do case $i in kvrouter | vllm-sim) need_runtime=1 ;; esac; done
if [ "$need_runtime" = 1 ]; then
	hack/debian-runtime.sh "$work/runtime" libzmq5
fi

for name in $IMAGES; do
	args=()
	case $name in
	manager) file=Dockerfile ;;
	kvrouter) file=Dockerfile.kvrouter ;;
	vllm-sim) file=Dockerfile.vllm-sim ;;
	bundle) file=bundle.Dockerfile ;;
	*) log "unknown image $name"; exit 2 ;;
	esac
	mapfile -d '' -t lab < <(labels "$file")
	if [ "$name" = bundle ]; then
		tag=$IMAGE_REPO/kvroute-bundle:$VERSION
		# COPY SRC DST lines of bundle.Dockerfile, one layer.
		layer=$(df "$file" | awk '$1 == "COPY" { printf "%s%s=%s", sep, $2, $3; sep = "," }')
		# OCI labels on top of bundle.Dockerfile's (which mirror annotations.yaml, nothing else).
		args+=(--layer "$layer" --label org.opencontainers.image.title=kvroute-bundle
			--label org.opencontainers.image.source=https://github.com/kvroute/kvroute
			--label "org.opencontainers.image.version=$VERSION" --label org.opencontainers.image.licenses=Apache-2.0)
	else
		tag=$IMAGE_REPO/$name:$VERSION
		build "$file" "$name"
		dst=$(df "$file" | awk -v b="/out/$name" '$1 == "COPY" && $2 == "--from=build" && $3 == b { print $4 }')
		[ -n "$dst" ] || { log "$file: no 'COPY --from=build /out/$name DEST'"; exit 1; }
		args+=(--layer "$base=/" --owner /home/nonroot=65532:65532)
		case $name in kvrouter | vllm-sim) args+=(--layer "$work/runtime=/") ;; esac
		args+=(--layer "$work/out/$name=$dst" --user "$(last "$file" USER)")
		mkdir -p "$work/links/$name"
		links "$file" "$work/links/$name"
		if [ -n "$(ls -A "$work/links/$name")" ]; then args+=(--layer "$work/links/$name=/"); fi
		# ENTRYPOINT ["a", "b"]: exec form only.
		while IFS= read -r e; do args+=(--entrypoint "$e"); done < <(last "$file" ENTRYPOINT | grep -oE '"[^"]*"' | tr -d '"')
	fi
	$GO run ./hack/ociimage --out "$OUT/$name.tar" --tag "$tag" --arch "$arch" "${args[@]}" "${lab[@]}" >&2
done
log "done in $(($(date +%s) - start))s:"
for name in $IMAGES; do
	printf '  %-40s %s\n' "$OUT/$name.tar" "$(du -h "$OUT/$name.tar" | cut -f1)" >&2
done
