#!/usr/bin/env bash
# Builds the real helm CLI at the release deploy/go.mod renders the chart with (one
# pin: helm.sh/helm/v3 there) into a machine-wide cache keyed by that version, apart
# from the node tools' cache. The Helm e2e test installs the chart with it.
#
#   e2e/harness/helm/build.sh              build it if missing, print the bin dir last
#   e2e/harness/helm/build.sh --print-bin  print the bin dir only (builds nothing)
#
# Source comes from the Go module proxy (`go install helm.sh/helm/v3/cmd/helm@version`,
# helm's own go.mod); progress goes to stderr, the bin dir alone to stdout.
set -euo pipefail

MODULE=helm.sh/helm/v3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HELM_VERSION=$(awk -v m=$MODULE '$1 == m {print $2}' "$here/../../../deploy/go.mod")
[[ $HELM_VERSION == v3.* ]] || { echo "no $MODULE version in deploy/go.mod" >&2; exit 1; }

bin=${XDG_CACHE_HOME:-$HOME/.cache}/nvinject/helm-$HELM_VERSION/bin
if [[ ${1:-} == --print-bin ]]; then
	echo "$bin"
	exit 0
fi

log() { printf '[helm %4ds] %s\n' "$SECONDS" "$*" >&2; }

if [[ -x $bin/helm ]]; then
	log "cached: helm $HELM_VERSION in $bin"
	echo "$bin"
	exit 0
fi
command -v go >/dev/null || { log "go is not on PATH: install Go, then rerun"; exit 1; }

# The Kubernetes version helm assumes without a cluster (helm template), as helm's
# Makefile derives it: client-go v0.X.Y in helm's own go.mod is Kubernetes 1.X.
gomod=$(GOWORK=off GOFLAGS= go mod download -json "$MODULE@$HELM_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
k8s_minor=$(awk '$1 == "k8s.io/client-go" {split($2, v, "."); print v[2]}' "$gomod")
[[ $k8s_minor =~ ^[0-9]+$ ]] || { log "no k8s.io/client-go version in $MODULE@$HELM_VERSION's go.mod ($gomod)"; exit 1; }
ldflags="-s -w -X $MODULE/internal/version.version=$HELM_VERSION -X $MODULE/internal/version.gitTreeState=clean"
ldflags+=" -X $MODULE/pkg/chartutil.k8sVersionMajor=1 -X $MODULE/pkg/chartutil.k8sVersionMinor=$k8s_minor"
ldflags+=" -X $MODULE/pkg/lint/rules.k8sVersionMajor=1 -X $MODULE/pkg/lint/rules.k8sVersionMinor=$k8s_minor"

mkdir -p "$(dirname "$bin")"
stage=$(mktemp -d "$(dirname "$bin")/.build-XXXXXX")
trap 'rm -rf "$stage"' EXIT
log "building helm from $MODULE/cmd/helm@$HELM_VERSION (Go module proxy; the first build takes minutes)"
# The workspace's go.work and GOFLAGS (build tags) must not leak into a foreign module.
if ! GOBIN=$stage GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0 go install -ldflags "$ldflags" \
	"$MODULE/cmd/helm@$HELM_VERSION" >&2; then
	log "go install $MODULE/cmd/helm@$HELM_VERSION failed: check that the Go module proxy ($(go env GOPROXY)) is reachable"
	exit 1
fi
got=$("$stage/helm" version --template '{{.Version}}')
if [[ $got != "$HELM_VERSION" ]]; then
	log "built helm reports version $got, want $HELM_VERSION"
	exit 1
fi
mkdir -p "$bin"
mv -f "$stage/helm" "$bin/helm"
log "ready: helm $got in $bin ($((SECONDS))s)"
echo "$bin"
