# Included by the root Makefile. Builds the pinned node programs (kubelet, apiserver,
# etcd, containerd, runc, crictl, ...) into a machine-wide cache, see build.sh.
NVINJECT_TOOLS_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
NVINJECT_TOOLS_BIN ?= $(shell $(NVINJECT_TOOLS_DIR)/build.sh --print-bin)
export NVINJECT_TOOLS_BIN

.PHONY: tools
tools: ## build the pinned node programs (kubelet, containerd, runc, ...) into the machine-wide cache
	$(NVINJECT_TOOLS_DIR)/build.sh

# The local-node end-to-end test (needs root): brings a real node up, runs a pod, tears down.
.PHONY: e2e-localnode
e2e-localnode: tools ## bring a local node up, run a pod, tear it down (root)
	cd $(NVINJECT_TOOLS_DIR)/.. && NVINJECT_TOOLS_BIN=$(NVINJECT_TOOLS_BIN) $(GO) test -count=1 -v -timeout 20m -run TestLocalNode ./kubelocal/
