#!/usr/bin/env bash
# Builds the pinned programs the local node runs (Kubernetes, etcd, containerd, runc,
# crictl) into a machine-wide cache keyed by the pins, so every checkout and CI job on
# the machine reuses one build.
#
#   e2e/harness/tools/build.sh              build what is missing, print the bin dir last
#   e2e/harness/tools/build.sh --print-bin  print the bin dir only (builds nothing)
#
# Kubernetes and etcd come from this directory's go.mod/go.sum (tool directives);
# containerd, runc and crictl are `go install pkg@version` with the versions below.
set -euo pipefail

KUBE_VERSION=v1.37.2
CONTAINERD_VERSION=v2.2.9
RUNC_VERSION=v1.4.4
CRICTL_VERSION=v1.37.0
# A fixed build date keeps the version strings (and so the binaries) reproducible.
BUILD_DATE=2026-01-01T00:00:00Z
DEBIAN_PACKAGES=(libseccomp-dev pkg-config gcc libc6-dev busybox-static containernetworking-plugins iproute2 util-linux curl)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export GOWORK=off
# Plain (non -trimpath) builds everywhere: mixing the two splits the Go build cache.
export GOFLAGS=-buildvcs=false

key_input() {
	cat "$here/go.mod" "$here/go.sum" "$here/cmd/etcd/main.go"
	echo "$KUBE_VERSION $CONTAINERD_VERSION $RUNC_VERSION $CRICTL_VERSION $BUILD_DATE"
	go env GOVERSION GOOS GOARCH
}
key=$(key_input | sha256sum | cut -c1-12)
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/nvinject
bin=$cache_root/tools-$key/bin

if [[ ${1:-} == --print-bin ]]; then
	echo "$bin"
	exit 0
fi

log() { printf '[tools %4ds] %s\n' "$((SECONDS))" "$*" >&2; }

ensure_packages() {
	local missing=()
	for p in "${DEBIAN_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	((${#missing[@]})) || return 0
	log "installing Debian packages: ${missing[*]}"
	if ((EUID != 0)); then
		log "not root: run 'apt-get install -y --no-install-recommends ${missing[*]}' as root, then rerun"
		exit 1
	fi
	apt-get update >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
}

kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	minor=${KUBE_VERSION#v1.}
	minor=${minor%%.*}
	kube_ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
	kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$BUILD_DATE"
done

# name|kind|package|flags: kind "tool" builds from this module, "install" is go install.
targets=(
	"kubelet|tool|k8s.io/kubernetes/cmd/kubelet|$kube_ldflags"
	"kube-apiserver|tool|k8s.io/kubernetes/cmd/kube-apiserver|$kube_ldflags"
	"kube-controller-manager|tool|k8s.io/kubernetes/cmd/kube-controller-manager|$kube_ldflags"
	"kube-scheduler|tool|k8s.io/kubernetes/cmd/kube-scheduler|$kube_ldflags"
	"kubectl|tool|k8s.io/kubernetes/cmd/kubectl|$kube_ldflags"
	"etcd|tool|github.com/nvinject/nvinject/e2e/tools/cmd/etcd|-s -w"
	"containerd|install|github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION|-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
	"containerd-shim-runc-v2|install|github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION|-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
	"ctr|install|github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION|-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
	"runc|install|github.com/opencontainers/runc@$RUNC_VERSION|-s -w -X main.version=${RUNC_VERSION#v}"
	"crictl|install|sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION|-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION"
)

# The harness needs some packages at run time too (CNI plugins, busybox,
# curl), so they are checked even when every binary is cached.
ensure_packages
total=${#targets[@]}
todo=0
for t in "${targets[@]}"; do [[ -x $bin/${t%%|*} ]] || todo=$((todo + 1)); done
if ((todo == 0)); then
	log "all $total binaries cached in $bin"
	echo "$bin"
	exit 0
fi
log "building $todo of $total binaries into $bin"
log "a first build takes ~20 min on 2 cores (cold Go caches; longer while other builds run); later builds relink in seconds"
mkdir -p "$bin"
stage=$(mktemp -d "$cache_root/.build-XXXXXX")
trap 'rm -rf "$stage"' EXIT

n=0
for t in "${targets[@]}"; do
	IFS='|' read -r name kind pkg flags <<<"$t"
	n=$((n + 1))
	if [[ -x $bin/$name ]]; then
		log "[$n/$total] $name: cached"
		continue
	fi
	start=$SECONDS
	log "[$n/$total] $name: building $pkg"
	tags=()
	[[ $name == runc ]] && tags=(-tags seccomp)
	case $kind in
	tool) (cd "$here" && go build "${tags[@]}" -ldflags "$flags" -o "$stage/$name" "$pkg") ;;
	install) GOBIN=$stage go install "${tags[@]}" -ldflags "$flags" "$pkg" ;;
	esac
	# go install names the binary after the package directory.
	built=$stage/$name
	[[ -x $built ]] || built=$stage/$(basename "${pkg%@*}")
	mv -f "$built" "$bin/$name"
	log "[$n/$total] $name: done in $((SECONDS - start))s"
done
log "all $total binaries ready in $bin (${SECONDS}s)"
echo "$bin"
