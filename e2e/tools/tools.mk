# Included by the root Makefile. Builds the pinned node programs (kubelet, apiserver,
# etcd, containerd, runc, crictl, ...) into a machine-wide cache, see build.sh.
NVINJECT_TOOLS_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
NVINJECT_TOOLS_BIN ?= $(shell $(NVINJECT_TOOLS_DIR)/build.sh --print-bin)
export NVINJECT_TOOLS_BIN

.PHONY: tools
tools:
	$(NVINJECT_TOOLS_DIR)/build.sh
