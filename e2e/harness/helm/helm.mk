# Included by the root Makefile. Builds the real helm CLI, pinned by deploy/go.mod,
# into its own machine-wide cache (see build.sh); the tests that install or render
# the chart with it read NVINJECT_HELM_BIN.
NVINJECT_HELM_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
NVINJECT_HELM_BIN ?= $(shell $(NVINJECT_HELM_DIR)/build.sh --print-bin)
export NVINJECT_HELM_BIN

.PHONY: helm
helm: ## build the real helm CLI (the version deploy/go.mod pins) into the machine-wide cache
	@$(NVINJECT_HELM_DIR)/build.sh >/dev/null
