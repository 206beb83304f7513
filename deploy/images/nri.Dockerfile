# syntax=docker/dockerfile:1
# Build from the repository root (the Go workspace):
#   docker build -f deploy/images/nri.Dockerfile -t ghcr.io/nvinject/nvinject-nri:v0.1.0 .
# cgo is on: go-nvml dlopens the driver's libnvidia-ml.so.1 at run time, so
# the binary needs glibc (distroless base, not static).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.work ./
COPY shared/ shared/
COPY cdi/ cdi/
COPY deviceplugin/ deviceplugin/
COPY nri/ nri/
COPY e2e/go.mod e2e/go.sum* e2e/
COPY deploy/go.mod deploy/go.sum deploy/
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=1 go build -trimpath -ldflags='-s -w' -o /out/nvinject-nri ./nri/cmd/nvinject-nri

# The manifests run it as uid 0 with no capabilities (root-owned 0600 NRI and
# pod-resources sockets); the image default stays nonroot.
FROM gcr.io/distroless/base-debian12:nonroot
COPY --from=build /out/nvinject-nri /usr/bin/nvinject-nri
ENTRYPOINT ["/usr/bin/nvinject-nri"]
