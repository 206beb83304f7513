// Package scenarios runs nvinject's end-to-end scenarios and the doctor's
// fault tests on one real local node (e2e/harness/kubelocal) with nvinject deployed
// by e2e/harness/rig: the GPU is SIMULATED, kubelet, containerd, runc and the
// API server are real. The node is brought up once in TestMain and shared;
// each test restores what it changed. Tests skip without root or
// NVINJECT_TOOLS_BIN (`make tools`).
package scenarios
