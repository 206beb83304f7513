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

.PHONY: test
test: tools ## unit and integration tests (real gRPC, real NRI adaptation, real containerd)
	$(GO) test -count=1 $(MODULE)/...

.PHONY: lint
lint: ## gofmt and go vet over the workspace
	@out=$$(gofmt -l shared cdi deviceplugin nri deploy e2e); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(MODULE)/...

.PHONY: bench
bench: ## Go benchmarks (figures are reported as ratios to an anchor of the same run)
	$(GO) test -run '^$$' -bench . -benchtime 200x $(MODULE)/...

.PHONY: fuzz
fuzz: ## run each fuzz target briefly
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 15s $(MODULE)/shared/gpu/gpuselect
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 15s $(MODULE)/cdi/ldcache

.PHONY: clean
clean:
	rm -rf $(BIN)
