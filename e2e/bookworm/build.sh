#!/usr/bin/env bash
# Builds a minimal Debian bookworm root filesystem (mmdebstrap, variant minbase: glibc,
# libc-bin's ldconfig, coreutils, bash, apt) as a tar, the base of the workload image
# that real-driver tests run in: NVIDIA's libraries need glibc, and the CDI hooks run
# ldconfig in the container's root.
#
#   e2e/bookworm/build.sh               build if missing, print the tar's path last
#   e2e/bookworm/build.sh --print-path  print the path only (builds nothing)
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

# host_mirror prints the URI of the host's Debian archive: the first apt entry (one-line
# .list or deb822 .sources) whose suite is the host's codename.
host_mirror() {
	local codename f
	codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
	[[ -n $codename ]] || return 0
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
		[[ -f $f ]] || continue
		if [[ $f == *.list ]]; then
			sed -E 's/#.*//; s/\[[^]]*\]//' "$f" | awk -v c="$codename" '$1 == "deb" && $3 == c { print $2 }'
		else
			awk -v c="$codename" '
				function flush() {
					if (types ~ /(^| )deb( |$)/ && enabled != "no")
						for (i = 1; i <= ns; i++) if (s[i] == c) { print u[1]; break }
					types = ""; enabled = ""; ns = 0; nu = 0
				}
				/^[ \t]*#/ { next }
				/^[ \t]*$/ { flush(); next }
				{
					k = tolower($1); sub(/:$/, "", k); $1 = ""; sub(/^ +/, "")
					if (k == "types") types = $0
					else if (k == "enabled") enabled = tolower($0)
					else if (k == "uris") nu = split($0, u, " ")
					else if (k == "suites") ns = split($0, s, " ")
				}
				END { flush() }' "$f"
		fi
	done | head -1
}

mirror=${NVINJECT_DEBIAN_MIRROR:-$(host_mirror)}
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
