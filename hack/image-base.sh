#!/usr/bin/env bash
# image-base.sh DEST: the base layer of kvroute's scratch images (what distroless gives the
# Dockerfiles): /etc/passwd and /etc/group with root and nonroot (65532), /etc/nsswitch.conf,
# /tmp (1777), /home/nonroot, and /etc/ssl/certs/ca-certificates.crt built the way
# update-ca-certificates builds it, from the files of Debian's ca-certificates package.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: hack/image-base.sh DEST}
rm -rf "$base"
mkdir -p "$base/etc/ssl/certs" "$base/tmp" "$base/home/nonroot"
chmod 1777 "$base/tmp"
chmod 700 "$base/home/nonroot"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$base/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$base/etc/group"
printf 'hosts: files dns\n' >"$base/etc/nsswitch.conf"
ca=$(mktemp -d)
trap 'rm -rf "$ca"' EXIT
KVROUTE_DEB_NO_DEPS=1 hack/debian-runtime.sh "$ca" ca-certificates
find "$ca/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort | xargs cat >"$base/etc/ssl/certs/ca-certificates.crt"
[ -s "$base/etc/ssl/certs/ca-certificates.crt" ] || { echo "image-base: no CA certificates" >&2; exit 1; }
