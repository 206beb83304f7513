# Included by the root Makefile (after e2e/harness/tools/tools.mk and e2e/e2e.mk).
# Needs root, like make e2e.

# make soak: the GPU Deployment (vLLM stand-in) kept running on the local
# node while kubelet restarts SOAK_KUBELET times, containerd SOAK_CONTAINERD
# times, each nvinject daemon is SIGKILLed SOAK_KILLS times and CDI spec
# files churn; prints re-register, NRI reconnect and pod figures and fails
# on any GPU lost from allocatable, any container with a wrong or missing
# GPU, or a restart without re-registration. Bounded by SOAK_BUDGET.
# `make e2e` runs the same TestSoak with the short default 5/3/2.
SOAK_KUBELET ?= 50
SOAK_CONTAINERD ?= 20
SOAK_KILLS ?= 10
SOAK_BUDGET ?= 15m
.PHONY: soak
soak: build sim-images tools ## the long soak on the local node: kubelet and containerd restarts, daemon kills, spec churn (root)
	NVINJECT_SOAK_KUBELET=$(SOAK_KUBELET) NVINJECT_SOAK_CONTAINERD=$(SOAK_CONTAINERD) NVINJECT_SOAK_KILLS=$(SOAK_KILLS) NVINJECT_SOAK_BUDGET=$(SOAK_BUDGET) \
	NVINJECT_TOOLS_BIN=$(NVINJECT_TOOLS_BIN) NVINJECT_BIN=$(EQUIPMENT) $(GO) test -count=1 -v -timeout 30m -run '^TestSoak$$' $(MODULE)/e2e/tests/scenarios/
