//go:build !nosim

// Package simulation holds nvinject's SIMULATION-only equipment, kept apart
// from what runs on real nodes: it simulates the NVIDIA driver install on
// disk. simroot writes a simulated driver root (placeholder libraries and
// nvidia-smi-sim), simfacts is the simulated GPUs' facts file, simtest the
// tests' simulated node, and cmd/nvidia-smi-sim the simulated nvidia-smi.
// The GPU itself is simulated by shared/gpu/sim (go-nvml's mock behind the
// real NVML interface), the kubelet plugins' fault routes by
// gpunode/simdebug; gpunode/README.md lists the whole simulation seam.
package simulation
