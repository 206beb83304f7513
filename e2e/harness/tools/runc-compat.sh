#!/usr/bin/env bash
# Builds a runc from before 1.3 (v1.2.6, what containerd 1.7 nodes commonly run) into a
# machine-wide cache: the hostile-image suite (cdi/hook/hostile) runs the CDI hooks under it
# as well as under the pinned runc, because runc < 1.3 hands a createContainer hook the
# container's environment when the hook has none.
#
#   e2e/harness/tools/runc-compat.sh              build if missing, print the bin dir last
#   e2e/harness/tools/runc-compat.sh --print-bin  print the bin dir only (builds nothing)
#
# runc 1.2.x's go.mod has replace directives, so `go install pkg@version` refuses it: the
# module is downloaded from the Go module proxy and built inside its own directory. About two
# minutes on 2 cores the first time; an flock keeps two callers from building at once.
set -euo pipefail

RUNC_COMPAT_VERSION=v1.2.6
MODULE=github.com/opencontainers/runc

cache=${XDG_CACHE_HOME:-$HOME/.cache}/nvinject/runc-$RUNC_COMPAT_VERSION
bin=$cache/bin
if [[ ${1:-} == --print-bin ]]; then
	echo "$bin"
	exit 0
fi

log() { printf '[runc-compat %4ds] %s\n' "$SECONDS" "$*" >&2; }

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [[ -x $bin/runc ]]; then
	log "cached: runc $RUNC_COMPAT_VERSION in $bin"
	echo "$bin"
	exit 0
fi
command -v go >/dev/null || { log "go is not on PATH: install Go, then rerun"; exit 1; }
command -v gcc >/dev/null || { log "gcc is missing (runc's seccomp support is cgo): apt-get install gcc libc6-dev libseccomp-dev, then rerun"; exit 1; }
export GOWORK=off GOFLAGS=-mod=mod
src=$(go mod download -json "$MODULE@$RUNC_COMPAT_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -d $src ]] || { log "go mod download $MODULE@$RUNC_COMPAT_VERSION failed: check that the Go module proxy ($(go env GOPROXY)) is reachable"; exit 1; }
log "building runc $RUNC_COMPAT_VERSION from $src"
stage=$(mktemp -d "$cache/.build-XXXXXX")
trap 'rm -rf "$stage"' EXIT
(cd "$src" && CGO_ENABLED=1 go build -tags seccomp -ldflags "-s -w -X main.version=${RUNC_COMPAT_VERSION#v}" -o "$stage/runc" .) >&2
mkdir -p "$bin"
mv -f "$stage/runc" "$bin/runc"
log "ready: $("$bin/runc" --version | head -1) in ${SECONDS}s"
echo "$bin"
