# Included by the root Makefile (after e2e/tools/tools.mk, which sets
# NVINJECT_TOOLS_BIN). Both targets need root.

# make demo: a real single-node Kubernetes with a SIMULATED A100, nvinject
# deployed with kubectl apply -k, the vLLM stand-in, the seed's evidence;
# KEEP=1 leaves the node up and prints the kubectl line to use.
.PHONY: demo
demo: build images tools ## a real single-node Kubernetes with a SIMULATED GPU, nvinject deployed, the vLLM stand-in, the evidence
	$(BIN)/nvinject-demo -repo $(CURDIR) -bin $(BIN) -tools-bin $(NVINJECT_TOOLS_BIN) $(if $(filter 1,$(KEEP)),-keep)

# make e2e: the GPU scenarios on one shared node (the doctor's fault tests
# run under make test).
.PHONY: e2e
e2e: build images tools ## the GPU scenarios on the real local node (root)
	NVINJECT_TOOLS_BIN=$(NVINJECT_TOOLS_BIN) NVINJECT_BIN=$(BIN) $(GO) test -count=1 -v -timeout 30m -skip '^TestDoctor' $(MODULE)/e2e/scenarios/
