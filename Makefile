# nvinject: one NVIDIA GPU from a `nvidia.com/gpu: 1` request into a container.
# Two commands set up everything on a fresh machine: `make demo` and `make test`.

SHELL := /bin/bash
.DEFAULT_GOAL := build

GO ?= go
BIN := $(CURDIR)/bin
MODULE := github.com/nvinject/nvinject
# go-nvml's cgo prologue warns about every deprecated NVML call; the
# warnings are upstream noise, not ours.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
# nri_no_wasm: nvinject loads no WebAssembly NRI plugins; skipping that
# support shortens every compile of the NRI runtime side used in tests.
export GOFLAGS ?= -buildvcs=false -tags=nri_no_wasm

include e2e/tools/tools.mk
include deploy/images.mk
include e2e/cluster/cluster.mk
include e2e/injbench/injbench.mk
include e2e/e2e.mk
include e2e/soak.mk

CMDS := $(MODULE)/cdi/cmd/nvinject-cdi \
	$(MODULE)/deviceplugin/cmd/... \
	$(MODULE)/nri/cmd/... \
	$(MODULE)/deploy/cmd/... \
	$(MODULE)/e2e/cmd/...

.PHONY: build
build: ## build every binary into bin/
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(CMDS)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/nvidia-smi-sim $(MODULE)/cdi/cmd/nvidia-smi-sim

# Node-level packages (a real kubelet/containerd each) run one at a time:
# kubelet's device-plugin dir and the node's ports are machine-wide. The
# doctor's fault tests run on the local node here; the GPU scenarios are
# `make e2e`.
NODE_PKGS := $(MODULE)/e2e/localnode $(MODULE)/e2e/cmd/nvinject-injbench
.PHONY: test
test: tools build ## unit, integration and local-node tests
	$(GO) test -count=1 $$($(GO) list $(MODULE)/... | grep -v -e '/e2e/scenarios$$' -e '/e2e/localnode$$' -e '/e2e/cmd/nvinject-injbench$$')
	$(GO) test -count=1 -p 1 -timeout 20m $(NODE_PKGS)
	NVINJECT_BIN=$(BIN) $(GO) test -count=1 -timeout 20m -run '^TestDoctor' $(MODULE)/e2e/scenarios/

STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nvinject/staticcheck-$(STATICCHECK_VERSION)/staticcheck
$(STATICCHECK):
	GOBIN=$(dir $@) GOFLAGS= $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

.PHONY: lint
lint: $(STATICCHECK) ## gofmt, go vet and staticcheck (pinned) over the workspace
	@out=$$(gofmt -l shared cdi deviceplugin nri deploy e2e); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(MODULE)/...
	$(STATICCHECK) $(MODULE)/...

BENCHTIME ?= 2000x
.PHONY: bench
bench: ## Go benchmarks; each figure has an anchor measured in the same run
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) $(MODULE)/shared/... $(MODULE)/cdi/... $(MODULE)/deviceplugin/... $(MODULE)/nri/...

.PHONY: fuzz
fuzz: ## run each fuzz target briefly
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 15s $(MODULE)/shared/gpu/gpuselect
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 15s $(MODULE)/cdi/ldcache
	$(GO) test -run '^$$' -fuzz FuzzDecodeCheckpoint -fuzztime 15s $(MODULE)/deviceplugin/internal/health

.PHONY: clean
clean:
	rm -rf $(BIN)
