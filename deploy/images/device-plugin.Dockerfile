# syntax=docker/dockerfile:1
# Build from the repository root (the Go workspace):
#   docker build -f deploy/images/device-plugin.Dockerfile -t ghcr.io/nvinject/nvinject-device-plugin:v0.1.0 .
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
    CGO_ENABLED=1 go build -trimpath -ldflags='-s -w' -o /out/nvinject-device-plugin ./deviceplugin/cmd/nvinject-device-plugin && \
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/nvinject-cdi-hook ./cdi/cmd/nvinject-cdi-hook

# The manifests run it as uid 0 with no capabilities (root-owned kubelet and
# CDI directories); the image default stays nonroot.
FROM gcr.io/distroless/base-debian12:nonroot
COPY --from=build /out/nvinject-device-plugin /usr/bin/nvinject-device-plugin
# Static: the init container copies it to the host, whose libc may differ.
COPY --from=build /out/nvinject-cdi-hook /usr/bin/nvinject-cdi-hook
ENTRYPOINT ["/usr/bin/nvinject-device-plugin"]
