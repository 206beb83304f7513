# Included by the root Makefile (after e2e/harness/tools/tools.mk, which sets
# NVINJECT_TOOLS_BIN). Both targets need root.

# make demo: a real single-node Kubernetes with a SIMULATED A100, nvinject
# deployed with kubectl apply -k, the vLLM stand-in, the evidence;
# KEEP=1 leaves the node up and prints the kubectl line to use.
# MODE=device-plugin (default) hands the GPU to kubelet by the device plugin;
# MODE=dra labels the node nvinject.io/gpu-mode=dra first, so nvinject-dra
# serves an unchanged nvidia.com/gpu limit (DRA, KEP-5004) and the
# evidence adds the DeviceClass, the ResourceSlice and the pod's ResourceClaim,
# then the example GPU share (components/dra-gpu-shares) on the node's second GPU.
# Both targets put NVIDIA's REAL driver user space (make driver-root) on the
# node: DRIVER_LAYOUT=flat (default) or debian; DRIVER_LAYOUT=simulated, or an
# unreachable Debian archive, uses the simulated driver root instead.
MODE ?= device-plugin
.PHONY: demo demo-fleet
demo-fleet: ## make demo NODES=3: three real nodes, both paths side by side
	$(MAKE) demo NODES=3

demo: build sim-images tools ## a real single-node Kubernetes with a SIMULATED GPU, nvinject deployed (MODE=device-plugin|dra, MIG=single|mixed), the vLLM stand-in, the evidence
	$(EQUIPMENT)/demo -repo $(CURDIR) -bin $(EQUIPMENT) -tools-bin $(NVINJECT_TOOLS_BIN) -driver-layout $(DRIVER_LAYOUT) -mode $(MODE) $(if $(MIG),-mig $(MIG)) $(if $(NODES),-nodes $(NODES)) $(if $(filter 1,$(KEEP)),-keep)

# make e2e: the GPU scenarios on one shared node (the doctor's fault tests
# run under make test), then the fleet scenarios on two nodes, one per path.
.PHONY: e2e
e2e: build sim-images tools helm ## the GPU scenarios on the real local node (root)
	DRIVER_LAYOUT=$(DRIVER_LAYOUT) NVINJECT_TOOLS_BIN=$(NVINJECT_TOOLS_BIN) NVINJECT_BIN=$(EQUIPMENT) $(GO) test -count=1 -v -timeout 30m -skip '^TestDoctor' $(MODULE)/e2e/tests/scenarios/
	DRIVER_LAYOUT=$(DRIVER_LAYOUT) NVINJECT_TOOLS_BIN=$(NVINJECT_TOOLS_BIN) NVINJECT_BIN=$(EQUIPMENT) $(GO) test -count=1 -v -timeout 15m $(MODULE)/e2e/tests/multinode/

# make e2e-fleet: the fleet scenarios on three real local nodes (24 GPUs): node 1
# device plugin on A100s, node 2 DRA on H100s, node 3 device plugin on A100s on the real
# 550.163.01 driver root (the others on 535.261.03).
.PHONY: e2e-fleet
e2e-fleet: build sim-images tools helm ## the fleet scenarios on three real local nodes under one control plane (root)
	FLEET_NODES=3 DRIVER_LAYOUT=$(DRIVER_LAYOUT) NVINJECT_TOOLS_BIN=$(NVINJECT_TOOLS_BIN) NVINJECT_BIN=$(EQUIPMENT) $(GO) test -count=1 -v -timeout 15m $(MODULE)/e2e/tests/multinode/

# make bench-node: pod create to Running through DRA (both ways of asking)
# against the device plugin's, BENCH_NODE_N pods a path, on the local node;
# with both daemons' idle RSS (BenchmarkGPUPodStart).
BENCH_NODE_N ?= 10
.PHONY: bench-node
bench-node: build sim-images tools ## DRA pod start vs the device plugin's on the real local node, n=BENCH_NODE_N each (root)
	DRIVER_LAYOUT=$(DRIVER_LAYOUT) NVINJECT_TOOLS_BIN=$(NVINJECT_TOOLS_BIN) NVINJECT_BIN=$(EQUIPMENT) $(GO) test -count=1 -run '^$$' -bench '^BenchmarkGPUPodStart$$' -benchtime $(BENCH_NODE_N)x -timeout 40m $(MODULE)/e2e/tests/scenarios/

# make gpu-bundle: _out/gpu-bundle.tar.gz, everything e2e/gpu/check.sh needs on a
# machine with a real GPU and driver but no network and no Go (e2e/gpu/README.md).
GPU_BUNDLE ?= $(CURDIR)/_out/gpu-bundle.tar.gz
.PHONY: gpu-bundle
gpu-bundle: tools ## the GPU-machine check's bundle (prebuilt binaries, runc, a tiny rootfs), at most 60 MiB
	GO=$(GO) LDFLAGS='$(LDFLAGS)' NVINJECT_TOOLS_BIN=$(NVINJECT_TOOLS_BIN) NVINJECT_NVCTK_BIN=$$($(NVINJECT_E2E_DIR)/nvctk/build.sh --print-bin) \
		e2e/gpu/bundle.sh $(GPU_BUNDLE)

# make gpu-dry-run: the GPU check's --dry-run from the bundle over each driver-root layout
# (a SIMULATED GPU, NVIDIA's real driver user space), so the check cannot rot; root.
GPU_DRY_LAYOUTS ?= flat debian usrlocal gke operator rhel
.PHONY: gpu-dry-run
gpu-dry-run: gpu-bundle ## check.sh --dry-run from the bundle over each driver-root layout (root)
	e2e/gpu/dryrun.sh $(GPU_BUNDLE) $(GPU_DRY_LAYOUTS)
