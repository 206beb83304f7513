#!/usr/bin/env bash
# nvinject on a machine with a REAL NVIDIA GPU and driver: no network, no Go, only this
# bundle (make gpu-bundle). Run as root from the unpacked bundle:
#
#   ./check.sh                 real NVML, the host's driver (driver root /)
#   ./check.sh --dry-run --driver-root DIR
#                              the same steps with a SIMULATED GPU (sim:a100-80gb) over
#                              DIR, a driver user space without a kernel module (on a
#                              machine without a GPU: make -s driver-root | tail -1)
#
# Options: --driver-root DIR (default /), --work DIR (default /tmp/nvinject-gpucheck),
# --watch SECONDS (device plugin health watch, default 20), --keep (leave the work dir).
# Steps, each reported PASS/FAIL/SKIP, with the commands and their output:
#   1 discovery   nvinject-cdi generate --nvml=real: the spec for the host's GPUs, validated;
#                 the first GPU's UUID, compared with the host's nvidia-smi
#   2 health      nvinject-device-plugin (real NVML, its Xid event registration) against
#                 nvinject-gpucheck kubelet: registration, ListAndWatch health, one Allocate
#   3 nvidia-ctk  nvidia-ctk cdi generate (the host's, else the bundle's) and what only one
#                 of the two specs puts into a container
#   4 container   runc runs rootfs/ with nvinject's CDI device injected (as containerd
#                 does): nvidia-smi -L and the UUID inside must be the injected GPU's
#   5 staged      the driver's files (what step 1's spec mounts) copied into an
#                 operator-style system root, as a GPU Operator driver container has them
#                 at /run/nvidia/driver; its spec made with --dev-root=/ and step 4 again
#   6 cuda        cuda-check (driver API, a PTX SAXPY kernel, every element compared) on
#                 the host and in the container given step 1's device: exact, and the
#                 container's bandwidth over the host's
# Exit status: 0 when every step that ran passed, 1 otherwise, 2 for a bad command line.
set -uo pipefail

B=$(cd "$(dirname "$0")" && pwd)
ROOT=/
WORK=/tmp/nvinject-gpucheck
WATCH=20
DRY=0
KEEP=0
usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
	case $1 in
	--dry-run) DRY=1 ;;
	--driver-root) ROOT=${2:?--driver-root needs a directory}; shift ;;
	--work) WORK=${2:?--work needs a directory}; shift ;;
	--watch) WATCH=${2:?--watch needs seconds}; shift ;;
	--keep) KEEP=1 ;;
	-h | --help) usage; exit 0 ;;
	*) echo "check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
	shift
done
[[ $WATCH =~ ^[0-9]+$ ]] || { echo "check.sh: --watch $WATCH: want whole seconds" >&2; exit 2; }
((EUID == 0)) || { echo "check.sh: run as root (runc, the device plugin's socket dir)" >&2; exit 2; }
[[ -d $ROOT ]] || { echo "check.sh: --driver-root $ROOT is not a directory" >&2; exit 2; }
if ((DRY)) && [[ $ROOT == / ]]; then
	echo "check.sh: --dry-run needs --driver-root DIR: a driver user space (make -s driver-root | tail -1)" >&2
	exit 2
fi

BIN=$B/bin
NVML=real
if ((DRY)); then NVML=sim:a100-80gb; fi
HOOK=$BIN/nvinject-cdi-hook
export PATH=$BIN:/usr/sbin:/usr/bin:/sbin:/bin
results=()
pids=()
failed=0
step() { printf '\n==== %s ====\n' "$*"; }
show() { printf '$ %s\n' "$*"; "$@" 2>&1 | sed 's/^/  /'; return "${PIPESTATUS[0]}"; }
result() { # result NAME PASS|FAIL|SKIP WHY
	results+=("$(printf '%-10s %-4s %s' "$1" "$2" "$3")")
	[[ $2 == FAIL ]] && failed=1
	printf -- '--> %s %s: %s\n' "$1" "$2" "$3"
}
cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
	[[ -n ${RUNC_ID:-} ]] && runc --root "$WORK/runc" delete -f "$RUNC_ID" >/dev/null 2>&1
	((KEEP)) || rm -rf "$WORK"
}
trap cleanup EXIT

rm -rf "$WORK"
mkdir -p "$WORK/cdi" "$WORK/kubelet" "$WORK/dp-cdi" "$WORK/runc"
echo "nvinject GPU-machine check: bundle $B, driver root $ROOT, work dir $WORK"
head -3 "$B/MANIFEST" 2>/dev/null
UUIDCMD=nvidia-smi
if ((DRY)); then
	echo "DRY RUN: the GPU is SIMULATED (--nvml=$NVML); nothing here has touched a real GPU."
	# A copy of the root with the SIMULATED GPUs' facts file, which the spec puts into the
	# container for nvidia-smi-sim, the simulated UUID query.
	ver=$(find "$ROOT" -xdev -name 'libnvidia-ml.so.[0-9]*.*' 2>/dev/null | head -1 | sed 's/.*libnvidia-ml\.so\.//')
	[[ -n $ver ]] || { echo "check.sh: $ROOT holds no libnvidia-ml.so.<version>" >&2; exit 2; }
	mkdir -p "$WORK/driver-root" "$WORK/simroot"
	cp -a "$ROOT/." "$WORK/driver-root/"
	nvinject-cdi simulate-driver-root --nvml="$NVML,driver=$ver" --smi="$BIN/nvidia-smi-sim" "$WORK/simroot" >/dev/null || exit 1
	install -D -m 644 "$WORK/simroot/usr/share/nvinject/simulated-gpus.json" "$WORK/driver-root/usr/share/nvinject/simulated-gpus.json"
	ROOT=$WORK/driver-root
	UUIDCMD=nvidia-smi-sim
	echo "driver root copied to $ROOT with the SIMULATED GPUs' facts (driver $ver)"
else
	echo "REAL RUN: NVML from the host's driver (--nvml=real)."
fi

# 1 discovery
step "1 discovery: nvinject-cdi generate --nvml=$NVML"
UUID=
if show nvinject-cdi generate --nvml="$NVML" --driver-root="$ROOT" --hook-binary="$HOOK" --output="$WORK/cdi/nvinject.yaml" &&
	show nvinject-cdi validate "$WORK/cdi/nvinject.yaml" && show nvinject-cdi list --cdi-spec-dir="$WORK/cdi"; then
	UUID=$(nvinject-cdi list --cdi-spec-dir="$WORK/cdi" 2>/dev/null | grep -o 'GPU-[0-9a-fA-F-]*' | head -1)
	libs=$(grep -c 'containerPath: .*\.so\.' "$WORK/cdi/nvinject.yaml")
	echo "  spec: $(grep -c 'hostPath:' "$WORK/cdi/nvinject.yaml") mounts ($libs libraries), $(grep -c 'hookName:' "$WORK/cdi/nvinject.yaml") hooks; first GPU $UUID"
	if ((DRY)); then
		result discovery PASS "SIMULATED GPU $UUID over the driver root $ROOT"
	else
		host=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>&1 | head -1)
		echo "  host nvidia-smi: first GPU $host"
		if [[ -n $UUID && $host == "$UUID" ]]; then
			result discovery PASS "real NVML: $UUID, as the host's nvidia-smi reports"
		else
			result discovery FAIL "nvinject's first GPU '$UUID' is not the host nvidia-smi's '$host'"
		fi
	fi
else
	result discovery FAIL "nvinject-cdi generate failed (output above)"
fi

# 2 health
step "2 health: nvinject-device-plugin against a stand-in kubelet for ${WATCH}s"
if [[ -z $UUID ]]; then
	result health SKIP "no GPU from step 1"
else
	nvinject-gpucheck kubelet --dir "$WORK/kubelet" --for "${WATCH}s" > "$WORK/kubelet.log" 2>&1 &
	kpid=$!
	pids+=("$kpid")
	sleep 0.5
	# No kubelet's PodResources socket here: the guard (fail closed without it) is turned off
	# explicitly; no Node either: the plugin skips its labels without --node-name.
	echo "  the plugin runs with --pod-resources-socket= (no kubelet's PodResources here: the guard against GPUs held through DRA is off) and no --node-name (no labels)"
	dpargs=(--nvml="$NVML" --driver-root="$ROOT" --kubelet-dir="$WORK/kubelet" --cdi-spec-dir="$WORK/dp-cdi"
		--visible-devices="$UUID" --hook-binary="$HOOK" --metrics-addr=127.0.0.1:19481 --log-format=text
		--pod-resources-socket= --state-dir="$WORK/dp-state" --mps-dir="$WORK/mps")
	echo "$ nvinject-device-plugin ${dpargs[*]}"
	nvinject-device-plugin "${dpargs[@]}" > "$WORK/plugin.log" 2>&1 &
	ppid=$!
	pids+=("$ppid")
	sleep $((WATCH > 4 ? WATCH - 2 : 2))
	echo "$ busybox wget -qO- http://127.0.0.1:19481/metrics | grep -E '^nvinject_device_plugin_(device_healthy|registrations_total|health_events_total|allocations_total)'"
	"$B/rootfs/bin/busybox" wget -qO- http://127.0.0.1:19481/metrics 2>&1 | grep -E '^nvinject_device_plugin_(device_healthy|registrations_total|health_events_total|allocations_total)' | sed 's/^/  /'
	wait "$kpid"
	krc=$?
	kill "$ppid" 2>/dev/null && wait "$ppid" 2>/dev/null
	echo "$ nvinject-gpucheck kubelet --dir $WORK/kubelet --for ${WATCH}s"
	sed 's/^/  /' "$WORK/kubelet.log"
	echo "device plugin log (health and registration lines):"
	grep -iE 'health|xid|event|regist|nvml|error|warn' "$WORK/plugin.log" | head -20 | sed 's/^/  /'
	if ((krc == 0)) && grep -q "ListAndWatch: .*$UUID Healthy" "$WORK/kubelet.log"; then
		result health PASS "registered, $UUID Healthy for ${WATCH}s, Allocate answered CDI names (no Xid was induced)"
	else
		result health FAIL "see the stand-in kubelet's and the plugin's output above"
	fi
fi

# 3 nvidia-ctk
step "3 nvidia-ctk: NVIDIA's generator on the same driver root"
CTK=$(command -v nvidia-ctk)
if [[ -z $CTK || $CTK == "$BIN/nvidia-ctk" ]]; then
	CTK=$(PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v nvidia-ctk || true)
	[[ -n $CTK ]] || CTK=$BIN/nvidia-ctk
fi
if [[ -z $UUID ]]; then
	result nvidia-ctk SKIP "no GPU from step 1"
elif [[ ! -x $CTK ]]; then
	result nvidia-ctk SKIP "no nvidia-ctk on the host or in the bundle"
else
	theirs=$UUID
	args=(cdi generate --driver-root="$ROOT" --output="$WORK/nvidia-ctk.yaml" --device-name-strategy=uuid)
	if ((DRY)); then
		# No NVML without a GPU: management mode over mknod'ed device nodes; its one device is "all".
		mkdir -p "$WORK/devroot/dev"
		mknod -m 666 "$WORK/devroot/dev/nvidiactl" c 195 255
		mknod -m 666 "$WORK/devroot/dev/nvidia0" c 195 0
		args+=(--mode=management --dev-root="$WORK/devroot")
		theirs=all
	fi
	echo "$ $CTK ${args[*]}   (its per-file 'Selecting' lines left out)"
	"$CTK" "${args[@]}" > "$WORK/nvidia-ctk.log" 2>&1
	crc=$?
	grep -v 'level=info msg="Selecting' "$WORK/nvidia-ctk.log" | sed 's/^/  /'
	if ((crc == 0)); then
		show nvinject-gpucheck compare --ours "$WORK/cdi/nvinject.yaml" --device "$UUID" --theirs "$WORK/nvidia-ctk.yaml" --their-device "$theirs"
		only=$(nvinject-gpucheck compare --ours "$WORK/cdi/nvinject.yaml" --device "$UUID" --theirs "$WORK/nvidia-ctk.yaml" --their-device "$theirs" | sed -n 's/^summary: \([0-9]*\) only in theirs.*/\1/p')
		result nvidia-ctk PASS "$CTK compared: ${only:-?} entries only nvidia-ctk injects (listed above; a report, not a verdict)"
	else
		result nvidia-ctk FAIL "$CTK cdi generate failed (output above)"
	fi
fi

# in_container NAME SPECDIR SCRIPT: runc runs SCRIPT in rootfs/ (with nvidia-smi-sim and
# cuda-check added) with the CDI device of SPECDIR injected; its output goes to
# WORK/NAME.log and is shown, its exit status is returned (125: no bundle).
in_container() {
	local name=$1 specdir=$2 script=$3 bundle=$WORK/bundle-$1 rc
	mkdir -p "$bundle"
	cp -a "$B/rootfs" "$bundle/rootfs"
	# The SIMULATED GPU's UUID query is nvidia-smi-sim (the real nvidia-smi cannot reach a GPU there).
	((DRY)) && cp "$BIN/nvidia-smi-sim" "$bundle/rootfs/usr/bin/nvidia-smi-sim"
	cp "$BIN/cuda-check" "$bundle/rootfs/usr/bin/cuda-check"
	RUNC_ID=nvinject-gpucheck-$name-$$
	if ! show nvinject-gpucheck oci --cdi-spec-dir "$specdir" --device "nvidia.com/gpu=$UUID" --bundle "$bundle" -- /bin/sh -c "$script"; then
		RUNC_ID=
		return 125
	fi
	echo "$ runc --root $WORK/runc run --bundle $bundle $RUNC_ID"
	LD_LIBRARY_PATH=$B/lib runc --root "$WORK/runc" run --bundle "$bundle" "$RUNC_ID" < /dev/null > "$WORK/$name.log" 2>&1
	rc=$?
	RUNC_ID=
	sed 's/^/  /' "$WORK/$name.log"
	return "$rc"
}

# container NAME SPECDIR: nvidia-smi, the UUID and ldconfig -p in a container given
# SPECDIR's device.
container() {
	local name=$1 specdir=$2 rrc inside gpus
	local script='echo "-- nvidia-smi -L"; nvidia-smi -L; echo "exit $?"
echo "-- uuid"; '$UUIDCMD' --query-gpu=uuid --format=csv,noheader; echo "exit $?"
echo "-- ldconfig -p"; ldconfig -p | grep -E "libcuda|libnvidia-ml"; echo "-- end"'
	in_container "$name" "$specdir" "$script"
	rrc=$?
	if ((rrc == 125)); then
		result "$name" FAIL "the OCI bundle could not be written (output above)"
		return
	fi
	inside=$(sed -n '/^-- uuid$/{n;p}' "$WORK/$name.log")
	gpus=$(sed -n '/^-- nvidia-smi -L$/,/^exit/p' "$WORK/$name.log" | grep -c '^GPU ')
	if ((DRY)); then
		if ((rrc == 0)) && [[ $inside == "$UUID" ]] && grep -q "couldn't communicate with the NVIDIA driver" "$WORK/$name.log" && grep -q 'libcuda.so.1 ' "$WORK/$name.log"; then
			result "$name" PASS "DRY: the real nvidia-smi failed only for want of the kernel driver, ldconfig -p lists libcuda.so.1, nvidia-smi-sim inside reports the injected SIMULATED GPU $UUID"
		else
			result "$name" FAIL "DRY: runc exit $rrc; inside: '$inside', injected: $UUID; see the container's output above"
		fi
	elif ((rrc == 0)) && [[ $inside == "$UUID" && $gpus == 1 ]]; then
		result "$name" PASS "the container sees exactly the injected GPU $UUID (nvidia-smi -L lists 1 GPU)"
	else
		result "$name" FAIL "runc exit $rrc; inside: '$inside' ($gpus GPUs in nvidia-smi -L), injected: $UUID"
	fi
}

# 4 container
step "4 container: runc with nvinject's CDI device injected"
if [[ -z $UUID ]]; then
	result container SKIP "no GPU from step 1"
else
	container container "$WORK/cdi"
fi

# 5 staged
step "5 staged: the driver's files in an operator-style root, --dev-root=/"
if [[ -z $UUID ]]; then
	result staged SKIP "no GPU from step 1"
else
	# Every file step 1's spec mounts, copied to its path in the container: a system root
	# holding the driver as a GPU Operator driver container does (/run/nvidia/driver).
	staged=$WORK/staged
	mkdir -p "$staged/usr/bin" "$staged/etc" "$WORK/cdi-staged"
	awk '$1 == "-" && $2 == "containerPath:" { c = $3 } $1 == "hostPath:" && c != "" { print c, $2; c = "" }' "$WORK/cdi/nvinject.yaml" |
		while read -r ctr src; do
			[[ -f $src ]] || continue
			install -D -m "$(stat -c %a "$src")" "$src" "$staged$ctr"
		done
	find "$staged" -name '*.so.*' -printf '/%P\n' | xargs -r -n1 dirname | sort -u > "$staged/etc/ld.so.conf"
	ldconfig -r "$staged" 2>/dev/null || echo "  (no ldconfig -r here: the staged root has no ld.so.cache; nvinject scans its directories)"
	echo "  staged $(find "$staged" -type f | wc -l) files in $staged ($(du -sh "$staged" | cut -f1))"
	snvml=$NVML
	# The SIMULATED driver follows the root's; a staged root holds the one step 1 used.
	((DRY)) && snvml=$NVML,driver=$ver
	if show nvinject-cdi generate --nvml="$snvml" --driver-root="$staged" --dev-root=/ --hook-binary="$HOOK" --output="$WORK/cdi-staged/nvinject.yaml"; then
		container staged "$WORK/cdi-staged"
	else
		result staged FAIL "nvinject-cdi generate over the staged root failed (output above)"
	fi
fi

# 6 cuda
step "6 cuda: checked CUDA work (cuda-check) on the host and in the container"
if [[ -z $UUID ]]; then
	result cuda SKIP "no GPU from step 1"
elif ((DRY)); then
	in_container cuda "$WORK/cdi" 'cuda-check; echo "exit $?"'
	if grep -q '^cuInit: 100 CUDA_ERROR_NO_DEVICE' "$WORK/cuda.log" && grep -q '^exit 3' "$WORK/cuda.log"; then
		result cuda PASS "DRY: cuda-check loaded the injected libcuda and cuInit returned 100 (no device), as without the kernel module"
	else
		result cuda FAIL "DRY: cuda-check in the container did not reach cuInit's no-device answer (output above)"
	fi
else
	echo "$ cuda-check   (on the host)"
	cuda-check > "$WORK/cuda-host.log" 2>&1
	hrc=$?
	sed 's/^/  /' "$WORK/cuda-host.log"
	in_container cuda "$WORK/cdi" cuda-check
	crc=$?
	bw() { sed -n 's/^saxpy bandwidth: \([0-9.]*\) GB\/s.*/\1/p' "$1"; }
	host_bw=$(bw "$WORK/cuda-host.log")
	ctr_bw=$(bw "$WORK/cuda.log")
	if ((hrc == 0 && crc == 0)) && [[ -n $host_bw && -n $ctr_bw ]]; then
		ratio=$(awk -v c="$ctr_bw" -v h="$host_bw" 'BEGIN { printf "%.3f", c / h }')
		result cuda PASS "SAXPY exact on the host and in the container; bandwidth $ctr_bw GB/s in the container vs $host_bw on the host (ratio $ratio)"
	else
		result cuda FAIL "cuda-check exit $hrc on the host, $crc in the container (output above)"
	fi
fi

printf '\n==== summary (%s) ====\n' "$( ((DRY)) && echo "DRY RUN, SIMULATED GPU" || echo "real GPU")"
printf '%s\n' "${results[@]}"
exit "$failed"
