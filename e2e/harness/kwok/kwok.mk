# Included by the root Makefile. Builds KWOK's controller, pinned in build.sh, into its
# own machine-wide cache; the fleet-scale simulator (make scale) runs it.
NVINJECT_KWOK_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))

.PHONY: kwok
kwok: ## build KWOK's controller (pinned) into the machine-wide cache
	@$(NVINJECT_KWOK_DIR)/build.sh >/dev/null

SCALE_NODES ?= 1000
.PHONY: scale
scale: tools kwok ## fleet-scale simulator: SCALE_NODES (1000) fake GPU nodes, half device plugin, half DRA, on a real control plane
	$(GO) run $(MODULE)/e2e/bench/cmd/scale-sim --tools-bin $(NVINJECT_TOOLS_BIN) --nodes $(SCALE_NODES)
