#!/usr/bin/env bash
# Builds a driver root holding NVIDIA's REAL driver user space (libcuda, NVML, nvidia-smi,
# firmware, ...) WITHOUT a kernel module, from Debian's archive, for tests and demos on
# machines without a GPU. Loading the libraries works; cuInit returns CUDA_ERROR_NO_DEVICE
# and nvmlInit NVML_ERROR_DRIVER_NOT_LOADED (see /work/shared/notes/real-driver.md).
#
#   e2e/harness/driverroot/build.sh [--version V] [--layout LAYOUT]   build if missing, print the root last
#   e2e/harness/driverroot/build.sh [--version V] [--layout L] --print-root   print the root's path only
#
# DRIVER_VERSION (default 535.261.03) picks the driver when --version is not given:
#   535.261.03  Debian 12 bookworm's packages
#   550.163.01  Debian 13 trixie's packages. trixie is merged-/usr: the firmware is in
#               usr/lib/firmware/nvidia/<version>/ and both layouts get the lib -> usr/lib
#               link a trixie host has, so /lib/firmware/... reaches it as it does there.
# DRIVER_LAYOUT (default flat) picks the layout when --layout is not given:
#   debian  as Debian's packages lay it out once installed: libraries in
#           usr/lib/x86_64-linux-gnu/nvidia/current/, the public names (libcuda.so.1,
#           usr/bin/nvidia-smi, ...) ABSOLUTE links through /etc/alternatives, recreated
#           from the nvidia-alternative package's postinst.
#   flat    as NVIDIA's .run installer lays it out: libraries in usr/lib/x86_64-linux-gnu
#           with relative soname links, binaries in usr/bin, firmware in
#           lib/firmware/nvidia/<version>/.
#   usrlocal  the driver in its own directory, usr/local/nvidia/{lib64,bin,firmware}
#           (lib -> lib64), as on GKE-style nodes and the H200 host of
#           /work/shared/notes/gpu-machine.md: usr/lib/libcuda.so{,.1} and
#           libnvidia-ml.so{,.1} absolute links into it, usr/bin/nvidia-smi a /bin/sh
#           wrapper that execs usr/local/nvidia/bin/nvidia-smi, etc/ld.so.conf.d/nvidia.conf
#           listing usr/local/nvidia/lib64 and lib.
#   gke     a driver directory and nothing else (GKE's /home/kubernetes/bin/nvidia):
#           lib64/, bin/, firmware/nvidia/<version>/ at the top; no etc/, no ld.so.cache.
#   operator  a GPU Operator driver container's root (/run/nvidia/driver): the flat
#           layout in a merged-/usr system root (lib -> usr/lib), with dev/ and
#           run/nvidia-persistenced/ as the driver container has them.
#   rhel    RHEL's: libraries in usr/lib64, binaries in usr/bin, firmware in
#           usr/lib/firmware/nvidia/<version>/, lib -> usr/lib and lib64 -> usr/lib64;
#           etc/ld.so.conf.d lists /usr/lib64 (RHEL's ldconfig trusts it built in,
#           Debian's, which builds the cache here, does not).
#
# The packages are fetched with a PRIVATE apt configuration (own sources, lists and
# cache; the host's Debian mirror URI with the non-free, non-free-firmware and contrib
# components): the host's apt state and installed packages are left untouched and nothing
# is installed; `dpkg -x` unpacks without maintainer scripts. Versions and sha256 sums are
# pinned below.
#
# Caches (machine-wide, ${XDG_CACHE_HOME:-$HOME/.cache}/nvinject/):
#   driver-debs-<version>/                        the .debs, shared by both layouts
#   driver-root-<version>-<layout>-<key>/root     the root; <key> hashes this script
# A root is built in a temporary directory and renamed into place, so a root that exists
# is complete: the second run prints it at once.
#
# Progress goes to stderr; stdout's last line is the root's path.
# Exit status 3 means Debian's archive could not be reached (callers may fall back to a
# simulated root); 1 is any other failure.
# Environment: NVINJECT_DEBIAN_MIRROR=URI overrides the mirror read from the host's apt
# sources (e.g. a local mirror).
set -euo pipefail

COMPONENTS=(main contrib non-free non-free-firmware)
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
LIBDIR=usr/lib/x86_64-linux-gnu
EXIT_UNAVAILABLE=3

LAYOUTS="debian|flat|usrlocal|gke|operator|rhel"
usage() { echo "usage: $0 [--version 535.261.03|550.163.01] [--layout $LAYOUTS] [--print-root]" >&2; exit 2; }

DRIVER_VERSION=${DRIVER_VERSION:-535.261.03}
layout=${DRIVER_LAYOUT:-flat}
print_only=0
while (($#)); do
	case $1 in
	--version) DRIVER_VERSION=${2:?--version needs 535.261.03 or 550.163.01}; shift 2 ;;
	--version=*) DRIVER_VERSION=${1#--version=}; shift ;;
	--layout) layout=${2:?--layout needs one of $LAYOUTS}; shift 2 ;;
	--layout=*) layout=${1#--layout=}; shift ;;
	--print-root) print_only=1; shift ;;
	*) usage ;;
	esac
done
case $layout in
debian | flat | usrlocal | gke | operator | rhel) ;;
*) echo "driver root: unknown layout '$layout' (DRIVER_LAYOUT=$LAYOUTS)" >&2; exit 2 ;;
esac

# Per version: SUITES; FIRMWARE, where firmware-nvidia-gsp puts nvidia/<version>/;
# MERGED_USR, whether the release is merged-/usr (the root then gets lib -> usr/lib);
# ABOUT, the manifest's lines on where the packages came from; and PACKAGES, "package
# version sha256": exactly what is downloaded and unpacked. nvidia-alternative is unpacked
# only for its postinst, which names the /etc/alternatives links of the debian layout.
case $DRIVER_VERSION in
535.261.03)
	SUITES=(bookworm bookworm-updates)
	FIRMWARE=lib/firmware
	MERGED_USR=0
	# nvidia-persistenced is in contrib and bookworm has only 535.171.04 of it.
	ABOUT=(
		"From Debian's archive (bookworm: non-free, non-free-firmware, contrib), unpacked with"
		"dpkg -x; no maintainer scripts ran. nvidia-persistenced is 535.171.04-1~deb12u1, the"
		"only version in contrib. Without the kernel module cuInit(0) returns 100"
		"(CUDA_ERROR_NO_DEVICE) and nvmlInit returns 9 (Driver Not Loaded)."
	)
	PACKAGES=(
		"libcuda1 535.261.03-1 de1e9ca34164a5983b3f752e6699cf1ad924790f1a843b7d582bab6f99206e1e"
		"libnvidia-ml1 535.261.03-1 c729da6ab729309dc3f481fe4d38f04ea03b0793154b0962b60117d2f37d082e"
		"nvidia-smi 535.261.03-1 9b4392fa97957603d96f3cf1141fe78d871f5bcdd2e6bf810bce278cc14cb6d4"
		"libnvidia-ptxjitcompiler1 535.261.03-1 4e03bb994324a81d1a39d1e3eb0fed3f7f3c31a2b606a6e9110300de4f4fa1a0"
		"libnvidia-nvvm4 535.261.03-1 74a63c955eb647da46c4d59b9e47a424fff29e4122b06bd8c58b19ff2d3aa5dd"
		"libnvidia-cfg1 535.261.03-1 a28c8932ee02bcc860d8ab0cdde184339526a4515b476fabfb95190febe32fef"
		"libnvidia-allocator1 535.261.03-1 5429dcc35b4034a22c9a87ea38e643a124c46a929867abe17b6727364cca12cd"
		"libcudadebugger1 535.261.03-1 289920bea961585b4f20d39f75cb82c3ba72a7b6bd7b2231a358540bdf5ce556"
		"nvidia-cuda-mps 535.261.03-1 1341544805aa9c839af45bac5a4bd697cb3eb43105eec439bfba60a8e13ba35a"
		"libnvidia-pkcs11-openssl3 535.261.03-1 d1b4532c2b447b6611908ae36dc3a4d930b7f810b5b045cc7f6dd3fb1674a417"
		"nvidia-kernel-support 535.261.03-1 172457cb2e65d377a599f19acaa0ef2726ffd80a4133d215b3349ab7b30cc20c"
		"libnvcuvid1 535.261.03-1 bb8a9eb5864b8d18b7bc4285e79f62732332749982cb638a6d286cdb294645de"
		"libnvidia-encode1 535.261.03-1 409c6c3cc1bfe1b2a12dfaa306384c4a561faf37bb2775b0b1412fc98cb0c3d9"
		"libnvidia-opticalflow1 535.261.03-1 2669cd3f883bda890085ebdf28e814b66ec41c7d9330ce393041dac6001cf125"
		"firmware-nvidia-gsp 535.261.03-1 ac2e9b2a90a7ba9475ab65d765db781b9c6fc6c6e8c5c838ca911fa1e9939843"
		"nvidia-persistenced 535.171.04-1~deb12u1 b7edec2139b799211f133f817fb2af9da93490336073fa7aff21a09beb15ac7d"
		"nvidia-alternative 535.261.03-1 d6f12958f525f3d546a54d11eb2792f6dc94a443a21c6c2c18fb7c765e4e5646"
	)
	;;
550.163.01)
	SUITES=(trixie trixie-updates)
	FIRMWARE=usr/lib/firmware
	MERGED_USR=1
	ABOUT=(
		"From Debian's archive (trixie: non-free, non-free-firmware, contrib), unpacked with"
		"dpkg -x; no maintainer scripts ran. nvidia-persistenced is 550.163.01-1 (contrib)."
		"trixie is merged-/usr: lib -> usr/lib as on a trixie host; the firmware is in"
		"usr/lib/firmware. Without the kernel module cuInit(0) returns 100"
		"(CUDA_ERROR_NO_DEVICE) and nvmlInit returns 9 (Driver Not Loaded)."
	)
	PACKAGES=(
		"libcuda1 550.163.01-2 8feff97aac61d6f27ded96a3c25b9e68025a680476e6072ff7eaf10623509135"
		"libnvidia-ml1 550.163.01-2 01c1b67d511d7f52c6aa60e14ed56a8eb725d5dc85784a08214d6cb0f4fd1f89"
		"nvidia-smi 550.163.01-2 547978bd189284911beace21d83834866026e4d5b2026d8bcb74f6cd147c8be9"
		"libnvidia-ptxjitcompiler1 550.163.01-2 73ce8da87e13d0cd5a7f5ec3e0b5822f91fe1cc72977542cd9a8354c25d810f4"
		"libnvidia-nvvm4 550.163.01-2 6b5177372c21edff846caeb98c9bc861eef6799c50c6b590f901d415c231c278"
		"libnvidia-cfg1 550.163.01-2 785098cf00a896bc44185de78df16ee71bb32f461bfe1909df54ae79c3df4a14"
		"libnvidia-allocator1 550.163.01-2 d2ccce70e05eb582779b3db25f60443f4ea494e36ac1ca0896119b51529ac74f"
		"libcudadebugger1 550.163.01-2 84eda607ffad753c26aa76f0a417fc3101087a030b85ea9c721c95d269ab3975"
		"nvidia-cuda-mps 550.163.01-2 7da3f29e5ad3390d9fddab7042fa6e9a76df85a69d69efc40401df2f83874764"
		"libnvidia-pkcs11-openssl3 550.163.01-2 39e29abbb943a7a1b0a701650318dc2f81b5f6b2fde52306258155fbc4e7eeb2"
		"nvidia-kernel-support 550.163.01-2 e6c652d5a006e08855e602f7b45a4d5f3c2f5199acc1918c6da7fb6c144739dd"
		"libnvcuvid1 550.163.01-2 83b137eca37fe6d4d0c321d57569b9f6081331d0ab25855e1745f468e347487a"
		"libnvidia-encode1 550.163.01-2 1402d74729927c43598ccf3990f6c0ea4418b3f30c258d435cb7ead56a037720"
		"libnvidia-opticalflow1 550.163.01-2 12fe492bdb0507a003141ca052c9bcb6a1b57f8236b70aaec3743374b586169e"
		"firmware-nvidia-gsp 550.163.01-2 e07e243f33cf7066737e3f556f3325a5e57199a9549a93f2158eec3921ea0beb"
		"nvidia-persistenced 550.163.01-1 a88e0567f0762fa1ccd02daa7e3779d6927141b7ce62c4bbbaae9205e2de332c"
		"nvidia-alternative 550.163.01-2 39ec2e4872ec620cccac54dd7162834ce3ee2e77bf5c1d38e2dab32467c2b050"
	)
	;;
*) echo "driver root: unknown driver version '$DRIVER_VERSION' (DRIVER_VERSION=535.261.03 or 550.163.01)" >&2; exit 2 ;;
esac

key=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/nvinject
out=$cache_root/driver-root-$DRIVER_VERSION-$layout-$key
root=$out/root
debs=$cache_root/driver-debs-$DRIVER_VERSION

if ((print_only)); then
	echo "$root"
	exit 0
fi

log() { printf '[driver-root %4ds] %s\n' "$SECONDS" "$*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -d $root ]]; then
	log "cached: $layout root of NVIDIA $DRIVER_VERSION user space (no kernel module)"
	echo "$root"
	exit 0
fi

for tool in dpkg-deb ldconfig sha256sum flock; do
	command -v "$tool" >/dev/null || die "$tool is missing: this script needs Debian's dpkg, libc-bin, coreutils and util-linux"
done

mkdir -p "$cache_root"
# One build at a time machine-wide (tests may ask for both layouts in parallel).
exec 9>"$cache_root/.driver-root.lock"
flock 9
if [[ -d $root ]]; then
	log "cached (built by a concurrent run): $root"
	echo "$root"
	exit 0
fi

stage=$(mktemp -d "$cache_root/.driver-root-XXXXXX")
trap 'rm -rf "$stage"' EXIT

deb_file() { echo "$debs/${1}_${2}_amd64.deb"; }

# shellcheck source=../../internal/cachebuild/debian-mirrors.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../internal/cachebuild/debian-mirrors.sh"

# fetch_debs downloads the pinned packages that are not in $debs yet, with a private apt
# configuration, and checks every file against its pinned sha256.
fetch_debs() {
	local need=() p name version sum
	for p in "${PACKAGES[@]}"; do
		read -r name version sum <<<"$p"
		local f
		f=$(deb_file "$name" "$version")
		if [[ -f $f ]] && echo "$sum  $f" | sha256sum -c --status; then
			continue
		fi
		need+=("$name=$version")
	done
	if ((${#need[@]} == 0)); then
		log "packages: all ${#PACKAGES[@]} cached in $debs"
		return 0
	fi

	command -v apt-get >/dev/null || die "apt-get is missing: the packages are fetched with Debian's apt"
	[[ -r $KEYRING ]] || die "$KEYRING is missing: apt-get install debian-archive-keyring, then rerun"
	local mirrors=()
	if [[ -n ${NVINJECT_DEBIAN_MIRROR:-} ]]; then
		mirrors=("$NVINJECT_DEBIAN_MIRROR")
	else
		mapfile -t mirrors < <(host_debian_mirrors)
		((${#mirrors[@]})) || mirrors=(http://deb.debian.org/debian)
	fi
	local apt=$stage/apt
	mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/parts" "$apt/download"
	{
		echo "Types: deb"
		echo "URIs: ${mirrors[*]}"
		echo "Suites: ${SUITES[*]}"
		echo "Components: ${COMPONENTS[*]}"
		echo "Signed-By: $KEYRING"
	} >"$apt/nvinject.sources"
	# APT_CONFIG is read before apt.conf.d: pointing Dir::Etc::Parts at an empty directory
	# keeps the host's hooks (update notifiers, cache cleaners, DEP-11 downloads) out of
	# this private run. The host's Acquire settings (proxies, date checks) are kept.
	{
		echo "Dir::Etc::Parts \"$apt/parts\";"
		echo "Dir::Etc::main \"/dev/null\";"
		apt-config dump Acquire 2>/dev/null | grep -v -e '^Acquire::IndexTargets' -e '^Acquire "";' || true
		# The staging dirs live in a private cache (often under /root): _apt could not
		# enter them, and apt would warn and fetch as root anyway. Files are checked by
		# apt's signed indexes and again against the sha256 sums pinned above.
		echo 'APT::Sandbox::User "root";'
		echo 'Acquire::Retries "1";'
		echo 'Acquire::http::Timeout "30";'
		echo 'Acquire::https::Timeout "30";'
	} >"$apt/apt.conf"
	local opts=(
		-o "Dir::Etc::SourceList=$apt/nvinject.sources"
		-o Dir::Etc::SourceParts=/dev/null
		-o "Dir::State::Lists=$apt/lists"
		-o "Dir::Cache=$apt/cache"
	)
	log "packages: fetching ${#need[@]} of ${#PACKAGES[@]} from ${mirrors[*]} (${SUITES[*]}: ${COMPONENTS[*]}), private apt state in $apt"
	local upd
	if ! upd=$(APT_CONFIG=$apt/apt.conf apt-get "${opts[@]}" update 2>&1) ||
		grep -qE '^(W|E): (Failed to fetch|Some index files failed)' <<<"$upd" ||
		! compgen -G "$apt/lists/*_Packages*" >/dev/null; then
		printf '%s\n' "$upd" | tail -5 >&2
		log "error: cannot reach Debian's archive at ${mirrors[*]} (apt-get update failed)."
		log "fix: give this machine HTTP access to ${mirrors[0]} (or a proxy via apt's Acquire::http::Proxy), or set NVINJECT_DEBIAN_MIRROR to a reachable Debian mirror; tests fall back to the simulated driver root meanwhile"
		exit $EXIT_UNAVAILABLE
	fi
	local dl
	if ! dl=$(cd "$apt/download" && APT_CONFIG=$apt/apt.conf apt-get "${opts[@]}" download "${need[@]}" 2>&1); then
		printf '%s\n' "$dl" | tail -5 >&2
		if grep -qE "Can't find a source|Version .* was not found|Unable to locate package" <<<"$dl"; then
			die "a pinned package version is no longer in Debian's archive (see above): update PACKAGES in e2e/harness/driverroot/build.sh"
		fi
		log "error: downloading from Debian's archive failed (see above)"
		log "fix: check HTTP access to ${mirrors[0]}, or set NVINJECT_DEBIAN_MIRROR; then rerun"
		exit $EXIT_UNAVAILABLE
	fi
	mkdir -p "$debs"
	for p in "${PACKAGES[@]}"; do
		read -r name version sum <<<"$p"
		local f
		f=$(deb_file "$name" "$version")
		[[ -f $f ]] && echo "$sum  $f" | sha256sum -c --status && continue
		local got
		got=$(compgen -G "$apt/download/${name}_*_amd64.deb" | head -1) || true
		[[ -n $got ]] || die "apt-get download did not produce $name $version"
		echo "$sum  $got" | sha256sum -c --status || die "$got does not match its pinned sha256 $sum"
		mv -f "$got" "$f.tmp" && mv -f "$f.tmp" "$f"
	done
	log "packages: $(du -sh "$debs" | cut -f1) in $debs"
}

# debian_alternatives recreates the links nvidia-alternative's postinst makes with
# update-alternatives, against the root: ROOT/<link> -> /etc/alternatives/<name> ->
# <path>, absolute as on an installed system. It reads the slave list from the postinst
# itself (the slaves, conf_slaves and kmod_slaves groups the non-open driver uses).
debian_alternatives() {
	local r=$1 ctl=$stage/nvidia-alternative.control
	dpkg-deb -e "$(deb_file nvidia-alternative "$(pinned_version nvidia-alternative)")" "$ctl"
	local postinst=$ctl/postinst
	local master
	master=$(grep -oE 'update-alternatives --install /[^ ]+ nvidia /usr/lib/nvidia/current [0-9]+' "$postinst" | head -1) ||
		die "nvidia-alternative's postinst no longer has the expected update-alternatives --install line"
	read -r _ _ master_link _ master_path _ <<<"$master"
	links=()
	# Same contract as the postinst's add_slave: a slave exists when its source file does.
	add_slave() {
		local target_link=$1 name=$2 source_path=$3
		if [[ -f $r$source_path ]]; then
			links+=("$target_link nvidia--$name $source_path")
		fi
	}
	add_multiarch_slave() {
		local target_dir=$1 target_sub_dir=$2 file=$3 source_dir=$4 source_sub_dir=$5 prefix=${6:-} triplet suffix
		for triplet in / /i386-linux-gnu/ /x86_64-linux-gnu/ /aarch64-linux-gnu/ /powerpc64le-linux-gnu/; do
			suffix=${triplet%/}
			suffix=${suffix:+-${suffix#/}}
			add_slave "$target_dir$triplet$target_sub_dir$file" "$prefix$file$suffix" "$source_dir$triplet$source_sub_dir$file"
		done
	}
	local calls line n=0
	calls=$(awk '/^\t(slaves|conf_slaves|kmod_slaves)="$/ { on = 1; next } on && /^"$/ { on = 0 } on' "$postinst" |
		sed -nE 's/^[[:space:]]*\$\((add_(multiarch_)?slave [^)]*)\)[[:space:]]*$/\1/p')
	[[ -n $calls ]] || die "found no add_slave calls in nvidia-alternative's postinst"
	while IFS= read -r line; do
		# Only literal words: the postinst is data here, never run.
		[[ $line =~ ^add_(multiarch_)?slave(\ [A-Za-z0-9_./@+\"-]+)+$ ]] || die "unexpected line in nvidia-alternative's postinst: $line"
		eval "$line"
		n=$((n + 1))
	done <<<"$calls"
	mkdir -p "$r/etc/alternatives" "$r$(dirname "$master_link")"
	ln -s "/etc/alternatives/nvidia" "$r$master_link"
	ln -s "$master_path" "$r/etc/alternatives/nvidia"
	local l target name src
	for l in "${links[@]}"; do
		read -r target name src <<<"$l"
		mkdir -p "$r$(dirname "$target")"
		ln -s "/etc/alternatives/$name" "$r$target"
		ln -s "$src" "$r/etc/alternatives/$name"
	done
	log "debian layout: ${#links[@]} alternatives links (of $n slave entries in the postinst) plus $master_link"
}

pinned_version() {
	local p name version sum
	for p in "${PACKAGES[@]}"; do
		read -r name version sum <<<"$p"
		[[ $name == "$1" ]] && { echo "$version"; return; }
	done
	return 1
}

# flatten moves what the packages put under Debian's paths to where NVIDIA's installer
# puts it; the packages' own relative soname links move with their libraries.
flatten() {
	local x=$1 r=$2
	mkdir -p "$r/$LIBDIR/gbm" "$r/usr/bin" "$r/usr/share/man/man1" "$r/${FIRMWARE%/*}"
	local f
	for f in "$x/$LIBDIR/nvidia/current"/*; do
		case ${f##*/} in
		nvidia-drm_gbm.so)
			ln -s ../libnvidia-allocator.so.1 "$r/$LIBDIR/gbm/nvidia-drm_gbm.so"
			rm "$f"
			;;
		*) mv "$f" "$r/$LIBDIR/" ;;
		esac
	done
	for f in "$x/$LIBDIR"/*.so*; do mv "$f" "$r/$LIBDIR/"; done
	mv "$x/usr/lib/nvidia/current/nvidia-smi" "$x"/usr/bin/* "$x"/usr/sbin/* "$r/usr/bin/"
	mv "$x/usr/lib/nvidia/current/nvidia-smi.1.gz" "$r/usr/share/man/man1/"
	mv "$x/$FIRMWARE" "$r/$FIRMWARE"
	mkdir -p "$r/usr/share"
	mv "$x/usr/share/nvidia" "$r/usr/share/"
	local left
	left=$(find "$x" \( -name '*.so*' -o -path '*/bin/*' -o -path '*/firmware/*' \) -print -quit)
	[[ -z $left ]] || die "flat layout: $left was left behind (the packages changed?)"
	local lib
	for lib in "$r/$LIBDIR"/*.so."$DRIVER_VERSION"; do
		[[ -f $lib && ! -L $lib ]] || die "flat layout: $lib is not a file"
	done
}

# usrlocal moves the flat root's driver into usr/local/nvidia and leaves links and a
# wrapper script at the public names, as the H200 host had them.
usrlocal() {
	local r=$1 nv=$1/usr/local/nvidia f
	mkdir -p "$nv/lib64" "$nv/bin" "$nv/firmware" "$r/usr/lib" "$r/etc/ld.so.conf.d"
	mv "$r/$LIBDIR"/* "$nv/lib64/"
	ln -s lib64 "$nv/lib"
	for f in "$r/usr/bin"/*; do mv "$f" "$nv/bin/"; done
	mv "$r/${FIRMWARE}/nvidia" "$nv/firmware/"
	for f in libcuda.so libcuda.so.1 libnvidia-ml.so libnvidia-ml.so.1; do
		ln -s "/usr/local/nvidia/lib64/$f" "$r/usr/lib/$f"
	done
	printf '#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi "$@"\n' >"$r/usr/bin/nvidia-smi"
	chmod 755 "$r/usr/bin/nvidia-smi"
	printf '/usr/local/nvidia/lib64\n/usr/local/nvidia/lib\n' >"$r/etc/ld.so.conf.d/nvidia.conf"
	printf 'include /etc/ld.so.conf.d/*.conf\n' >"$r/etc/ld.so.conf"
}

# gke keeps only the driver directory: lib64/, bin/, firmware/ at the top.
gke() {
	local r=$1 d=$2
	mkdir -p "$d"
	mv "$r/$LIBDIR" "$d/lib64"
	mv "$r/usr/bin" "$d/bin"
	mv "$r/${FIRMWARE}" "$d/firmware"
	mkdir -p "$d/share"
	mv "$r/usr/share/nvidia" "$d/share/"
}

# rhel moves the flat root's libraries to usr/lib64 and makes RHEL's merged-/usr links.
rhel() {
	local r=$1
	mkdir -p "$r/usr/lib64" "$r/usr/lib/firmware" "$r/etc/ld.so.conf.d"
	mv "$r/$LIBDIR"/* "$r/usr/lib64/"
	rmdir "$r/$LIBDIR"
	if [[ $FIRMWARE == lib/firmware ]]; then
		mv "$r/lib/firmware/nvidia" "$r/usr/lib/firmware/"
		rmdir "$r/lib/firmware" "$r/lib"
	fi
	ln -s usr/lib "$r/lib"
	ln -s usr/lib64 "$r/lib64"
	printf '/usr/lib64\n' >"$r/etc/ld.so.conf.d/rhel-lib64.conf"
	printf 'include ld.so.conf.d/*.conf\n' >"$r/etc/ld.so.conf"
}

# operator puts the flat layout in a merged-/usr system root as the GPU Operator's driver
# container has it.
operator() {
	local r=$1
	if [[ $FIRMWARE == lib/firmware ]]; then
		mkdir -p "$r/usr/lib/firmware"
		mv "$r/lib/firmware/nvidia" "$r/usr/lib/firmware/"
		rmdir "$r/lib/firmware" "$r/lib"
	fi
	ln -s usr/lib "$r/lib"
	mkdir -p "$r/dev" "$r/run/nvidia-persistenced" "$r/usr/sbin"
}

# unversioned soname links missing from the packages are made by ldconfig below, as on a
# real system (dpkg's ldconfig trigger, NVIDIA's installer). A root with its own
# etc/ld.so.conf keeps it.
run_ldconfig() {
	local r=$1
	[[ -e $r/etc/ld.so.conf ]] || printf '%s\n' "/$LIBDIR" >"$r/etc/ld.so.conf"
	# ldconfig -r chroots: root, or a user namespace where we are.
	if ((EUID == 0)); then
		ldconfig -r "$r"
	else
		unshare -r ldconfig -r "$r" || die "ldconfig -r needs root or unprivileged user namespaces (unshare -r)"
	fi
	ldconfig -p -C "$r/etc/ld.so.cache" | grep -q 'libcuda.so.1 ' || die "ldconfig -r $r did not list libcuda.so.1"
}

write_manifest() {
	local r=$1 m=$1/${2:-usr/share}/nvinject/driver-root.txt p name version sum
	mkdir -p "${m%/*}"
	{
		echo "nvinject test driver root: real NVIDIA driver user space, no kernel module."
		echo "NVIDIA driver $DRIVER_VERSION, layout $layout, built by e2e/harness/driverroot/build.sh (key $key)."
		printf '%s\n' "${ABOUT[@]}"
		echo
		echo "package version sha256"
		for p in "${PACKAGES[@]}"; do echo "$p"; done
	} >"$m"
}

fetch_debs
log "unpacking ${#PACKAGES[@]} packages with dpkg -x ($layout layout)"
x=$stage/x
mkdir -p "$x"
for p in "${PACKAGES[@]}"; do
	read -r name version _ <<<"$p"
	dpkg-deb -x "$(deb_file "$name" "$version")" "$x"
done
case $layout in
debian)
	r=$x
	debian_alternatives "$r"
	;;
*)
	r=$stage/flat
	flatten "$x" "$r"
	;;
esac
# What a merged-/usr host has (base-files makes it, not the driver's packages): /lib/firmware
# is where NVIDIA's CDI generator looks for the GSP firmware.
if ((MERGED_USR)) && [[ $layout == debian || $layout == flat || $layout == usrlocal ]]; then
	[[ ! -e $r/lib ]] || die "$DRIVER_VERSION's packages put files in /lib, but the release is merged-/usr"
	ln -s usr/lib "$r/lib"
fi
case $layout in
usrlocal) usrlocal "$r" ;;
rhel) rhel "$r" ;;
operator) operator "$r" ;;
gke)
	gke "$r" "$stage/gke"
	r=$stage/gke
	;;
esac
if [[ $layout == gke ]]; then
	# A driver directory has no loader configuration of its own.
	write_manifest "$r" share
else
	mkdir -p "$r/etc"
	run_ldconfig "$r"
	write_manifest "$r"
fi
mkdir -p "$stage/out"
mv "$r" "$stage/out/root"
mv -T "$stage/out" "$out"
log "built $layout root ($(du -sh "$root" | cut -f1)) in ${SECONDS}s: $root"
echo "$root"
