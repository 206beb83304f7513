#!/usr/bin/env bash
# Builds the GPU-machine bundle: everything e2e/gpu/check.sh needs beyond the host's
# NVIDIA driver, as prebuilt binaries, in one tar.gz for a machine with no network and
# no Go.
#
#   e2e/gpu/bundle.sh OUT.tar.gz    (make gpu-bundle: _out/gpu-bundle.tar.gz)
#
# Environment: GO (go), LDFLAGS (the version ldflags), NVINJECT_TOOLS_BIN (the pinned
# runc), NVINJECT_NVCTK_BIN (nvidia-ctk and nvidia-cdi-hook; optional). Prints the
# bundle's path last; refuses a bundle over 60 MiB.
set -euo pipefail

out=${1:?usage: bundle.sh OUT.tar.gz}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
GO=${GO:-go}
MODULE=github.com/nvinject/nvinject
LIMIT=$((60 * 1024 * 1024))
log() { printf '[gpu-bundle %3ds] %s\n' "$SECONDS" "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -x ${NVINJECT_TOOLS_BIN:-}/runc ]] || die "no runc in NVINJECT_TOOLS_BIN=${NVINJECT_TOOLS_BIN:-}: run make tools"
stage=$(mktemp -d /tmp/nvinject-gpu-bundle.XXXXXX)
trap 'rm -rf "$stage"' EXIT
b=$stage/nvinject-gpu
mkdir -p "$b/bin" "$b/lib" "$b/rootfs"

# -s -w: no symbol tables (smaller); link-only, so the compile cache is shared with make build.
ld="-s -w ${LDFLAGS:-}"
log "building nvinject-cdi, nvinject-device-plugin (cgo, glibc: NVML is dlopened)"
(cd "$repo" && $GO build -ldflags "$ld" -o "$b/bin/" $MODULE/cdi/cmd/nvinject-cdi $MODULE/deviceplugin/cmd/nvinject-device-plugin)
log "building nvinject-cdi-hook, nvinject-gpucheck, nvidia-smi-sim (static)"
(cd "$repo" && CGO_ENABLED=0 $GO build -ldflags "$ld" -o "$b/bin/" $MODULE/cdi/cmd/nvinject-cdi-hook $MODULE/e2e/gpu/cmd/nvinject-gpucheck $MODULE/cdi/simulation/cmd/nvidia-smi-sim)
log "building cuda-check (C, glibc, libcuda dlopened: no CUDA toolkit needed)"
${CC:-gcc} -O2 -Wall -Wextra -Werror -std=c11 -o "$b/bin/cuda-check" "$here/cudacheck/cuda-check.c" -ldl
cp "$NVINJECT_TOOLS_BIN/runc" "$b/bin/runc"
# runc links libseccomp; the GPU machine may not have it.
while read -r lib; do cp -L "$lib" "$b/lib/"; done < <(ldd "$b/bin/runc" | awk '/libseccomp/ { print $3 }')
if [[ -x ${NVINJECT_NVCTK_BIN:-}/nvidia-ctk ]]; then
	cp "$NVINJECT_NVCTK_BIN/nvidia-ctk" "$NVINJECT_NVCTK_BIN/nvidia-cdi-hook" "$b/bin/"
else
	log "no nvidia-ctk in NVINJECT_NVCTK_BIN: the check uses the host's nvidia-ctk when it has one"
fi

# The container's root file system: static busybox, glibc (the driver's nvidia-smi and
# libraries are glibc programs; the host's driver is mounted in by the CDI spec) and
# the static ldconfig, so `ldconfig -p` shows what the update-ldcache hook wrote.
r=$b/rootfs
mkdir -p "$r/bin" "$r/sbin" "$r/etc" "$r/usr/bin" "$r/usr/lib/x86_64-linux-gnu" "$r/lib64" "$r/proc" "$r/dev" "$r/sys" "$r/tmp"
ln -s usr/lib "$r/lib"
cp /bin/busybox "$r/bin/busybox"
for a in sh cat grep ls readlink wc head env; do ln -s busybox "$r/bin/$a"; done
cp /sbin/ldconfig "$r/sbin/ldconfig"
for l in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1; do
	cp -L "/lib/x86_64-linux-gnu/$l" "$r/usr/lib/x86_64-linux-gnu/$l"
done
ln -s /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$r/lib64/ld-linux-x86-64.so.2"
echo /usr/lib/x86_64-linux-gnu > "$r/etc/ld.so.conf"
file /bin/busybox /sbin/ldconfig | grep -q 'statically linked\|static-pie' || die "busybox and ldconfig must be static (apt-get install busybox-static)"

cp "$here/check.sh" "$here/README.md" "$here/cudacheck/cuda-check.c" "$b/"
{
	echo "nvinject GPU-machine bundle, version ${VERSION:-dev} revision ${REVISION:-unknown}, built $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
	echo "glibc programs need glibc >= 2.34 on the GPU machine; rootfs/ carries glibc $(ldd --version | head -1 | awk '{print $NF}')"
	echo "runc: $("$b/bin/runc" --version | head -1)"
	[[ -x $b/bin/nvidia-ctk ]] && echo "nvidia-ctk: $("$b/bin/nvidia-ctk" --version | head -1)"
	echo
	(cd "$b" && find . -type f | sort | xargs sha256sum)
} > "$b/MANIFEST"

mkdir -p "$(dirname "$out")"
tar -C "$stage" -czf "$out.tmp" nvinject-gpu
mv "$out.tmp" "$out"
size=$(stat -c %s "$out")
log "bundle $out: $((size / 1024)) KiB compressed, $(du -sk "$b" | cut -f1) KiB unpacked"
((size <= LIMIT)) || die "bundle is $size bytes, over the 60 MiB limit"
echo "$out"
