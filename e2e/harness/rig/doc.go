// Package simnode deploys nvinject onto a local node (e2e/harness/kubelocal) the way
// an operator would: OCI images imported into the node's containerd, a
// SIMULATED driver root on the host, and `kubectl apply -k` of a
// kustomization whose base is deploy/overlays/local-sim and whose only
// patches are the local node's paths and the selected GPU. It also runs the
// vLLM stand-in through deploy/examples/vllm.
//
// The GPU is the only simulated part: NVML is sim:a100-80gb[*N] and
// nvidia-smi is nvidia-smi-sim; kubelet, containerd, runc and the API
// server are real.
package rig
