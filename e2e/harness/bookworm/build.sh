#!/usr/bin/env bash
# Builds a minimal Debian bookworm root filesystem (mmdebstrap, variant minbase: glibc,
# libc-bin's ldconfig, coreutils, bash, apt) as a tar, the base of the workload image
# that real-driver tests run in: NVIDIA's libraries need glibc, and the CDI hooks run
# ldconfig in the container's root.
#
#   e2e/harness/bookworm/build.sh               build if missing, print the tar's path last
#   e2e/harness/bookworm/build.sh --print-path  print the path only (builds nothing)
#
# Cached machine-wide at ${XDG_CACHE_HOME:-$HOME/.cache}/nvinject/bookworm-<key>/rootfs.tar,
# <key> hashing this script and the mirror; built in a temporary directory and renamed
# into place. mmdebstrap is installed from Debian when missing (that is the only change
# to the host). Needs root (mmdebstrap's root mode). Progress goes to stderr.
# Exit status 3: Debian's archive could not be reached.
# Environment: NVINJECT_DEBIAN_MIRROR=URI overrides the mirror read from the host's apt
# sources.
set -euo pipefail

SUITE=bookworm
VARIANT=minbase
INCLUDE=libc6,libc-bin
# A fixed SOURCE_DATE_EPOCH makes mmdebstrap's output reproducible for equal packages.
SOURCE_DATE_EPOCH=1735689600 # 2025-01-01
export SOURCE_DATE_EPOCH
EXIT_UNAVAILABLE=3

log() { printf '[bookworm %4ds] %s\n' "$SECONDS" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# shellcheck source=../../internal/cachebuild/debian-mirrors.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../internal/cachebuild/debian-mirrors.sh"

# The host's first Debian mirror, else Debian's own.
mirror=${NVINJECT_DEBIAN_MIRROR:-$(host_debian_mirrors | head -1)}
mirror=${mirror:-http://deb.debian.org/debian}
key=$({ cat "${BASH_SOURCE[0]}"; echo "$mirror"; } | sha256sum | cut -c1-12)
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/nvinject
out=$cache_root/bookworm-$key
tarball=$out/rootfs.tar

if [[ ${1:-} == --print-path ]]; then
	echo "$tarball"
	exit 0
fi
if [[ -f $tarball ]]; then
	log "cached: $tarball"
	echo "$tarball"
	exit 0
fi

((EUID == 0)) || die "mmdebstrap's root mode needs root: rerun as root"
if ! command -v mmdebstrap >/dev/null; then
	log "installing mmdebstrap from Debian (apt-get install --no-install-recommends mmdebstrap)"
	apt-get install -y --no-install-recommends mmdebstrap >&2 ||
		{ apt-get update >&2 && apt-get install -y --no-install-recommends mmdebstrap >&2; } ||
		die "could not install mmdebstrap: run 'apt-get update && apt-get install mmdebstrap', then rerun"
fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.bookworm.lock"
flock 9
if [[ -f $tarball ]]; then
	log "cached (built by a concurrent run): $tarball"
	echo "$tarball"
	exit 0
fi
stage=$(mktemp -d "$cache_root/.bookworm-XXXXXX")
trap 'rm -rf "$stage"' EXIT

log "mmdebstrap --variant=$VARIANT $SUITE from $mirror (a minute or two)"
# Docs, man pages and translations are left out, as in Debian's slim images; copyright
# files stay.
if ! mmdebstrap --mode=root --variant="$VARIANT" --include="$INCLUDE" \
	--dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' \
	"$SUITE" "$stage/rootfs.tar" "deb $mirror $SUITE main" "deb $mirror $SUITE-updates main" 2>"$stage/log"; then
	tail -8 "$stage/log" >&2
	if grep -qE "Failed to fetch|Could not resolve|Could not connect|Unable to connect|Temporary failure" "$stage/log"; then
		log "error: cannot reach Debian's archive at $mirror"
		log "fix: give this machine HTTP access to $mirror, or set NVINJECT_DEBIAN_MIRROR to a reachable Debian mirror"
		exit $EXIT_UNAVAILABLE
	fi
	die "mmdebstrap failed (see above)"
fi
# grep without -q reads all of tar's output (pipefail would see tar's SIGPIPE).
tar -tf "$stage/rootfs.tar" | grep -x './usr/sbin/ldconfig' >/dev/null || die "the rootfs has no /usr/sbin/ldconfig"
mkdir -p "$stage/out"
mv "$stage/rootfs.tar" "$stage/out/rootfs.tar"
mv -T "$stage/out" "$out"
log "built $tarball ($(du -h "$tarball" | cut -f1)) in ${SECONDS}s"
echo "$tarball"
