# nvinject: one NVIDIA GPU from a `nvidia.com/gpu: 1` request into a container.
# Two commands set up everything on a fresh machine: `make demo` and `make test`.

SHELL := /bin/bash
.DEFAULT_GOAL := build

GO ?= go
# bin/ holds the shipped programs, built without the GPU simulation (the
# nosim tag); _out/equipment/ holds the test and demo equipment and a
# SIMULATION build of every shipped program (same source, simulation
# linked), which the local node, the demo and the tests run.
BIN := $(CURDIR)/bin
EQUIPMENT := $(CURDIR)/_out/equipment
MODULE := github.com/nvinject/nvinject
# The one version of nvinject: binaries (--version), image tags and labels,
# the Helm chart and the manifests' image references all derive from it.
VERSION ?= 0.2.0
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X $(MODULE)/shared/version.Version=$(VERSION) -X $(MODULE)/shared/version.Revision=$(REVISION)
export VERSION REVISION
# go-nvml's cgo prologue warns about every deprecated NVML call; the
# warnings are upstream noise, not ours.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
# nri_no_wasm: nvinject loads no WebAssembly NRI plugins; skipping that
# support shortens every compile of the NRI runtime side used in tests.
# grpcnotrace: gRPC without golang.org/x/net/trace, whose html/template
# keeps every exported method alive (2.6 MB of the device plugin's 17).
TAGS := nri_no_wasm,grpcnotrace
export GOFLAGS ?= -buildvcs=false -tags=$(TAGS)

include e2e/harness/tools/tools.mk
include e2e/harness/helm/helm.mk
include deploy/images.mk
include e2e/tests/cluster/cluster.mk
include e2e/bench/injbench/injbench.mk
include e2e/e2e.mk
include e2e/harness/driverroot/driverroot.mk
include e2e/soak.mk
include e2e/harness/kwok/kwok.mk

# The shipped programs (bin/, the release images).
CMDS := $(MODULE)/cdi/cmd/nvinject-cdi \
	$(MODULE)/deviceplugin/cmd/... \
	$(MODULE)/dra/cmd/... \
	$(MODULE)/doctor/cmd/... \
	$(MODULE)/fleet/cmd/... \
	$(MODULE)/nri/cmd/... \
	$(MODULE)/deploy/cmd/...
# The test and demo equipment's programs (_out/equipment/).
EQUIPMENT_CMDS := $(MODULE)/e2e/cmd/... $(MODULE)/e2e/demo $(MODULE)/e2e/harness/cmd/... $(MODULE)/e2e/bench/cmd/...
# The packages that make up the GPU simulation; no shipped program links one.
SIM_PKGS := $(MODULE)/shared/gpu/sim $(MODULE)/gpunode/simdebug $(MODULE)/nri/internal/simfault \
	$(MODULE)/cdi/simulation $(MODULE)/dra/scalesim github.com/NVIDIA/go-nvml/pkg/nvml/mock

.PHONY: build
build: equipment ## the shipped programs into bin/ (no simulation), the test and demo equipment into _out/equipment/
	@mkdir -p $(BIN)
	$(GO) build -tags $(TAGS),nosim -ldflags '$(LDFLAGS)' -o $(BIN)/ $(CMDS)
	CGO_ENABLED=0 $(GO) build -tags $(TAGS),nosim -ldflags '$(LDFLAGS)' -o $(BIN)/nvinject-cdi-hook $(MODULE)/cdi/cmd/nvinject-cdi-hook
	@$(MAKE) --no-print-directory shipped-check

.PHONY: equipment
equipment: ## the test and demo equipment and a SIMULATION build of each shipped program, into _out/equipment/
	@mkdir -p $(EQUIPMENT)
	$(GO) build -ldflags '$(LDFLAGS)' -o $(EQUIPMENT)/ $(CMDS) $(EQUIPMENT_CMDS)
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(EQUIPMENT)/nvidia-smi-sim $(MODULE)/cdi/simulation/cmd/nvidia-smi-sim
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(EQUIPMENT)/nvinject-cdi-hook $(MODULE)/cdi/cmd/nvinject-cdi-hook

# shipped-check: every program in bin/ is a release build (go version -m
# shows its tags) and names no simulation package among its functions (the
# symbol table is stripped, the function table Go keeps for stacks is not).
.PHONY: shipped-check
shipped-check: ## check that no program in bin/ links a simulation package
	@bad=0; for f in $(BIN)/*; do \
	  mods=$$($(GO) version -m $$f) || { echo "shipped-check: $$f is not a Go program"; bad=1; continue; }; \
	  echo "$$mods" | grep -q -- '-tags=.*nosim' || { echo "shipped-check: $$f was built without the nosim tag"; bad=1; }; \
	  for p in $(SIM_PKGS); do if grep -aq -- "$$p[./]" $$f; then echo "shipped-check: $$f links $$p"; bad=1; fi; done; \
	done; [ $$bad = 0 ] && echo "shipped-check: $$(ls $(BIN) | wc -l) programs in bin/, none links the simulation"

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

# Packages that need root, the pinned node tools or a whole local node.
NODE_ONLY := -e '/e2e/tests/scenarios$$' -e '/e2e/tests/multinode$$' -e '/e2e/harness/kubelocal$$' -e '/e2e/bench/cmd/injbench$$' -e '/e2e/bench/scale$$'
.PHONY: unit
unit: ## unit tests only: no root, no tools build, no local node
	NVINJECT_TOOLS_BIN= $(GO) test -count=1 $$($(GO) list $(MODULE)/... | grep -v $(NODE_ONLY))

# Node-level packages (a real kubelet/containerd each) run one at a time:
# kubelet's device-plugin dir and the node's ports are machine-wide. The
# doctor's fault tests run on the local node here; the GPU scenarios are
# `make e2e`.
# The GPU check's dry run in make test covers three kinds of driver root
# (a system root, one whose driver lives in /usr/local/nvidia behind wrapper
# scripts as on the H200 host, a bare driver directory; each run also stages an
# operator root);
# e2e/tests/layouts runs all six layouts under runc, make gpu-dry-run all six.
GPU_TEST_LAYOUTS := flat usrlocal gke
NODE_PKGS := $(MODULE)/e2e/harness/kubelocal $(MODULE)/e2e/bench/cmd/injbench $(MODULE)/e2e/bench/scale
.PHONY: test
test: tools helm kwok build sim-images ## unit, integration and local-node tests
	NVINJECT_BIN=$(EQUIPMENT) NVINJECT_SHIPPED_BIN=$(BIN) $(GO) test -count=1 $$($(GO) list $(MODULE)/... | grep -v $(NODE_ONLY))
	NVINJECT_BIN=$(EQUIPMENT) $(GO) test -count=1 -p 1 -timeout 20m $(NODE_PKGS)
	NVINJECT_BIN=$(EQUIPMENT) $(GO) test -count=1 -timeout 20m -run '^TestDoctor' $(MODULE)/e2e/tests/scenarios/
	$(MAKE) --no-print-directory gpu-dry-run GPU_DRY_LAYOUTS="$(GPU_TEST_LAYOUTS)"

STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nvinject/staticcheck-$(STATICCHECK_VERSION)/staticcheck
$(STATICCHECK):
	GOBIN=$(dir $@) GOFLAGS= $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

GO_MODULES := shared cdi gpunode deviceplugin dra doctor fleet nri deploy e2e

.PHONY: lint
lint: $(STATICCHECK) modcheck ## gofmt, go vet, staticcheck (pinned) and the module checks over the workspace
	@out=$$(gofmt -l $(GO_MODULES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(MODULE)/...
	$(STATICCHECK) $(MODULE)/...

.PHONY: tidy
tidy: ## go work sync, then go mod tidy in every module
	$(GO) work sync
	for m in $(GO_MODULES); do (cd $$m && $(GO) mod tidy) || exit 1; done

# Every module tidy, go work sync a no-op, and one version of each
# dependency across the modules' go.mod files.
.PHONY: modcheck
modcheck: ## the module checks: tidy, synced, one version per dependency
	@for m in $(GO_MODULES); do (cd $$m && GOFLAGS=-mod=mod $(GO) mod tidy -diff >/dev/null) || { echo "$$m/go.mod is not tidy: run make tidy"; exit 1; }; done
	@tmp=$$(mktemp -d) && for m in $(GO_MODULES); do mkdir -p $$tmp/$$m && cp $$m/go.mod $$tmp/$$m/; done && \
	  $(GO) work sync && for m in $(GO_MODULES); do cmp -s $$m/go.mod $$tmp/$$m/go.mod || { cp $$tmp/$$m/go.mod $$m/go.mod; echo "$$m/go.mod differs from the workspace's versions: run make tidy"; exit 1; }; done; rm -rf $$tmp
	@dup=$$(awk '$$1 ~ /^[a-z]/ && $$2 ~ /^v[0-9]/ && $$1 !~ /^github.com\/nvinject\// {print $$1, $$2}' $(addsuffix /go.mod,$(GO_MODULES)) | sort -u | awk '{n[$$1]++; v[$$1]=v[$$1] " " $$2} END {for (k in n) if (n[k] > 1) print k ":" v[k]}'); \
	  if [ -n "$$dup" ]; then echo "one dependency at several versions across modules (run make tidy):"; echo "$$dup"; exit 1; fi

BENCHTIME ?= 2000x
# Benchmarks whose every iteration waits for a directory change or a runtime
# restart take tens of milliseconds each: they run 20 iterations.
SLOW_BENCH := Freshness|Reconnect
.PHONY: bench
bench: ## Go benchmarks; each figure has an anchor measured in the same run
	$(GO) test -run '^$$' -bench . -skip '$(SLOW_BENCH)' -benchtime $(BENCHTIME) $(MODULE)/shared/... $(MODULE)/cdi/... $(MODULE)/gpunode/... $(MODULE)/deviceplugin/... $(MODULE)/dra/... $(MODULE)/nri/...
	$(GO) test -run '^$$' -bench '$(SLOW_BENCH)' -benchtime 20x $(MODULE)/nri/...

.PHONY: fuzz
fuzz: ## run each fuzz target briefly
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 15s $(MODULE)/shared/contract
	$(GO) test -run '^$$' -fuzz FuzzParseAuditNote -fuzztime 15s $(MODULE)/shared/contract
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 15s $(MODULE)/shared/gpu/gpuselect
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 15s $(MODULE)/shared/sharing
	$(GO) test -run '^$$' -fuzz FuzzParseAccess -fuzztime 15s $(MODULE)/shared/gpu/nvcaps
	$(GO) test -run '^$$' -fuzz FuzzParseDevices -fuzztime 15s $(MODULE)/shared/gpu/nvcaps
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 15s $(MODULE)/cdi/ldcache
	$(GO) test -run '^$$' -fuzz FuzzResolve -fuzztime 15s $(MODULE)/shared/driverroot
	$(GO) test -run '^$$' -fuzz FuzzContainerRoot -fuzztime 15s $(MODULE)/cdi/hook
	$(GO) test -run '^$$' -fuzz FuzzHookArgs -fuzztime 15s $(MODULE)/cdi/hook
	$(GO) test -run '^$$' -fuzz FuzzConfDirs -fuzztime 15s $(MODULE)/cdi/ldcache
	$(GO) test -run '^$$' -fuzz FuzzWrapperTarget -fuzztime 15s $(MODULE)/cdi/driver
	$(GO) test -run '^$$' -fuzz FuzzReadELF -fuzztime 15s $(MODULE)/cdi/ldcache
	$(GO) test -run '^$$' -fuzz FuzzDecodeCheckpoint -fuzztime 15s $(MODULE)/gpunode/health
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 15s $(MODULE)/dra/internal/claimconfig

.PHONY: set-version
set-version: ## write VERSION into the Helm chart and the Kustomize image tags (make set-version VERSION=x.y.z)
	sed -i -E 's/^(version|appVersion): .*/\1: $(VERSION)/' deploy/helm/nvinject/Chart.yaml
	sed -i -E 's/(newTag: )v.*/\1v$(VERSION)/' deploy/base/kustomization.yaml deploy/components/dra/kustomization.yaml

.PHONY: clean
clean: ## remove bin/ and _out/equipment/
	rm -rf $(BIN) $(EQUIPMENT)
