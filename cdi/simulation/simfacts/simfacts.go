//go:build !nosim

// Package simfacts is the facts file of a SIMULATED driver root: what the
// simulated nvidia-smi reports for each GPU whose device node it can see.
// It has no dependencies so that the simulated nvidia-smi builds static.
package simfacts

import (
	"encoding/json"
	"fmt"
	"os"
)

// GPU is one simulated GPU as nvidia-smi would describe it.
type GPU struct {
	Index     int    `json:"index"`
	Minor     int    `json:"minor"`
	UUID      string `json:"uuid"`
	Name      string `json:"name"`
	MemoryMiB uint64 `json:"memoryMiB"`
	PCIBusID  string `json:"pciBusID"`
	MIG       bool   `json:"mig"`
	// MIGDevices are the GPU's MIG devices when MIG mode is on.
	MIGDevices []MIGDevice `json:"migDevices,omitempty"`
}

// MIGDevice is one simulated MIG device. CIAccessMinor is the minor of
// /dev/nvidia-caps/nvidia-cap<minor> granting its compute instance: a
// container sees the MIG device only with that node, as with real NVML.
type MIGDevice struct {
	UUID            string `json:"uuid"`
	Profile         string `json:"profile"`
	GPUInstance     int    `json:"gpuInstance"`
	ComputeInstance int    `json:"computeInstance"`
	CIAccessMinor   int    `json:"ciAccessMinor"`
	MemoryMiB       uint64 `json:"memoryMiB"`
}

// Facts is the whole simulated node.
type Facts struct {
	Simulated     string `json:"simulated"`
	DriverVersion string `json:"driverVersion"`
	CUDAVersion   string `json:"cudaVersion"`
	GPUs          []GPU  `json:"gpus"`
}

// Notice is written into every facts file so nobody mistakes it for a GPU.
const Notice = "SIMULATED by nvinject: no real GPU or driver stands behind this file"

// Read loads a facts file.
func Read(path string) (Facts, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Facts{}, err
	}
	var f Facts
	if err := json.Unmarshal(data, &f); err != nil {
		return Facts{}, fmt.Errorf("parse %s: %w", path, err)
	}
	return f, nil
}
