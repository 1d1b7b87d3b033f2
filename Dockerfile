# The operator (manager). Pure Go, CGO_ENABLED=0, so the final stage is a static distroless image
# with nothing but the binary and CA certificates. The router has its own Dockerfile.kvrouter
# because it links libzmq through cgo.
#
#   docker build -t ghcr.io/kvroute/manager:v0.1.0 --build-arg VERSION=v0.1.0 .
#
# hack/docker-build-check.sh runs the same `go build` line on the host.
ARG GO_IMAGE=golang:1.26-bookworm
FROM ${GO_IMAGE} AS build
# What --version prints and kvroute_build_info exports (internal/version); `make docker-build`
# passes the checkout's commit and the build time.
ARG VERSION=dev
ARG COMMIT=
ARG BUILD_DATE=
ARG TARGETOS=linux
ARG TARGETARCH=amd64
WORKDIR /src
# Modules first, so a source change does not invalidate the download layer.
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY controllers/ controllers/
COPY cmd/manager/ cmd/manager/
COPY internal/version/ internal/version/
COPY internal/suggest/ internal/suggest/
COPY internal/vllmrelease/ internal/vllmrelease/
COPY internal/engineflags/ internal/engineflags/
COPY router/config/ router/config/
COPY router/engine/ router/engine/
COPY router/blockkey/ router/blockkey/
COPY router/score/ router/score/
# BUILD: manager
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -ldflags="-s -w -X github.com/kvroute/kvroute/internal/version.version=${VERSION} -X github.com/kvroute/kvroute/internal/version.commit=${COMMIT} -X github.com/kvroute/kvroute/internal/version.date=${BUILD_DATE}" -o /out/manager ./cmd/manager

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="kvroute-manager" \
      org.opencontainers.image.description="KVRoutedModel operator" \
      org.opencontainers.image.source="https://github.com/kvroute/kvroute" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
