#!/usr/bin/env bash
# Builds KWOK's controller, kwok, pinned at one release of sigs.k8s.io/kwok, into a
# machine-wide cache keyed by that version. The fleet-scale simulator
# (e2e/bench/cmd/scale-sim) runs it to give thousands of fake nodes and their pods a
# lifecycle against the local control plane.
#
#   e2e/harness/kwok/build.sh              build it if missing, print the bin dir last
#   e2e/harness/kwok/build.sh --print-bin  print the bin dir only (builds nothing)
#
# Source comes from the Go module proxy (`go install sigs.k8s.io/kwok/cmd/kwok@version`);
# progress goes to stderr, the bin dir alone to stdout.
set -euo pipefail

KWOK_VERSION=v0.8.0
MODULE=sigs.k8s.io/kwok

bin=${XDG_CACHE_HOME:-$HOME/.cache}/nvinject/kwok-$KWOK_VERSION/bin
if [[ ${1:-} == --print-bin ]]; then
	echo "$bin"
	exit 0
fi

log() { printf '[kwok %4ds] %s\n' "$SECONDS" "$*" >&2; }

if [[ -x $bin/kwok ]]; then
	log "cached: kwok $KWOK_VERSION in $bin"
	echo "$bin"
	exit 0
fi
command -v go >/dev/null || { log "go is not on PATH: install Go, then rerun"; exit 1; }

mkdir -p "$(dirname "$bin")"
stage=$(mktemp -d "$(dirname "$bin")/.build-XXXXXX")
trap 'rm -rf "$stage"' EXIT
log "building kwok from $MODULE/cmd/kwok@$KWOK_VERSION (Go module proxy; the first build takes minutes)"
# The workspace's go.work and GOFLAGS (build tags) must not leak into a foreign module.
if ! GOBIN=$stage GOWORK=off GOFLAGS= CGO_ENABLED=0 go install "$MODULE/cmd/kwok@$KWOK_VERSION" >&2; then
	log "go install $MODULE/cmd/kwok@$KWOK_VERSION failed: check that the Go module proxy ($(go env GOPROXY)) is reachable"
	exit 3
fi
mkdir -p "$bin"
mv -f "$stage/kwok" "$bin/kwok"
log "ready: kwok $KWOK_VERSION in $bin ($((SECONDS))s)"
echo "$bin"
