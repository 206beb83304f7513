# syntax=docker/dockerfile:1
# Build from the repository root (the Go workspace):
#   docker build -f deploy/images/dra.Dockerfile -t ghcr.io/nvinject/nvinject-dra:v0.1.0 .
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
    CGO_ENABLED=1 go build -trimpath -ldflags='-s -w' -o /out/nvinject-dra ./deviceplugin/cmd/nvinject-dra

# The manifests run it as uid 0 with no capabilities (root-owned kubelet and
# CDI directories); the image default stays nonroot.
FROM gcr.io/distroless/base-debian12:nonroot
COPY --from=build /out/nvinject-dra /usr/bin/nvinject-dra
ENTRYPOINT ["/usr/bin/nvinject-dra"]
