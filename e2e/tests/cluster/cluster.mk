# Cluster e2e suite (e2e/tests/cluster). Included by the root Makefile; run from
# the repository root. Skips cleanly when KUBECONFIG is unset; set one up on a
# GPU host with e2e/tests/cluster/nvkind-up.sh. See e2e/tests/cluster/doc.go for the
# NVINJECT_* variables.
E2E_CLUSTER_TIMEOUT ?= 45m

.PHONY: e2e-cluster
e2e-cluster: ## the cluster suite against KUBECONFIG (skipped without one)
	cd e2e && $(GO) test -tags e2e -timeout $(E2E_CLUSTER_TIMEOUT) ./cluster/... -v
