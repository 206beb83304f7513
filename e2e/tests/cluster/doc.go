// Package cluster is the end-to-end suite for a real GPU cluster (the
// the nvkind set-up, see nvkind-up.sh). Its tests carry the e2e build
// tag and run against $KUBECONFIG:
//
//	KUBECONFIG=... go test -tags e2e ./e2e/tests/cluster/... -v
//
// Environment:
//
//	KUBECONFIG                   cluster to test; the suite skips without it
//	NVINJECT_CLUSTER_DEPLOY      "installed" (default): use what is installed;
//	                             "apply": kubectl apply -k the overlay and deploy/examples/vllm first
//	NVINJECT_DEPLOY_OVERLAY      kustomization to apply (default deploy/overlays/nvkind-worker)
//	NVINJECT_WORKER              the GPU worker's Node name (default: the only node publishing nvidia.com/gpu)
//	NVINJECT_VLLM_READY_TIMEOUT  how long vLLM may take to become Ready (default 20m; it downloads the model)
package cluster
