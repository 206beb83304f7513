#!/usr/bin/env bash
# Builds NVIDIA's own CDI generator, nvidia-ctk, and the hook binary its specs call,
# nvidia-cdi-hook, pinned at one release of github.com/NVIDIA/nvidia-container-toolkit,
# into a machine-wide cache. They are the anchor nvinject's CDI output is compared with.
#
#   e2e/harness/nvctk/build.sh              build what is missing, print the bin dir last
#   e2e/harness/nvctk/build.sh --print-bin  print the bin dir only (builds nothing)
#
# Source comes from the Go module proxy (`go install pkg@version`); nothing from NVIDIA is
# vendored into this repository. Progress goes to stderr, the bin dir alone to stdout.
set -euo pipefail

NVCTK_VERSION=v1.20.2
MODULE=github.com/NVIDIA/nvidia-container-toolkit
PROGRAMS=(nvidia-ctk nvidia-cdi-hook)

bin=${XDG_CACHE_HOME:-$HOME/.cache}/nvinject/nvidia-ctk-$NVCTK_VERSION/bin
if [[ ${1:-} == --print-bin ]]; then
	echo "$bin"
	exit 0
fi

log() { printf '[nvidia-ctk %4ds] %s\n' "$SECONDS" "$*" >&2; }

missing=()
for p in "${PROGRAMS[@]}"; do [[ -x $bin/$p ]] || missing+=("$p"); done
if ((${#missing[@]} == 0)); then
	log "cached: ${PROGRAMS[*]} $NVCTK_VERSION in $bin"
	echo "$bin"
	exit 0
fi

command -v go >/dev/null || { log "go is not on PATH: install Go, then rerun"; exit 1; }
# go-nvml (linked into nvidia-ctk) is cgo; it dlopens NVML at run time, so gcc is
# all the build needs, no driver.
command -v gcc >/dev/null || { log "gcc is missing (nvidia-ctk needs cgo): apt-get install gcc libc6-dev, then rerun"; exit 1; }

mkdir -p "$(dirname "$bin")"
stage=$(mktemp -d "$(dirname "$bin")/.build-XXXXXX")
trap 'rm -rf "$stage"' EXIT
for p in "${missing[@]}"; do
	start=$SECONDS
	log "building $p from $MODULE@$NVCTK_VERSION (Go module proxy; the first build takes minutes)"
	# The workspace's go.work and GOFLAGS (build tags) must not leak into a foreign module.
	# -X sets the version string NVIDIA's Makefile would (else "version unknown").
	if ! GOBIN=$stage GOWORK=off GOFLAGS= CGO_ENABLED=1 go install \
		-ldflags "-s -w -X $MODULE/internal/info.version=${NVCTK_VERSION#v}" \
		"$MODULE/cmd/$p@$NVCTK_VERSION" >&2; then
		log "go install $MODULE/cmd/$p@$NVCTK_VERSION failed: check that the Go module proxy ($(go env GOPROXY)) is reachable"
		exit 1
	fi
	log "$p: built in $((SECONDS - start))s"
done
mkdir -p "$bin"
for p in "${missing[@]}"; do mv -f "$stage/$p" "$bin/$p"; done
log "ready: $("$bin/nvidia-ctk" --version 2>/dev/null | head -1)"
echo "$bin"
