//go:build !nosim

package sim

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/nvcaps"
)

// CapsMajor is the major the simulation gives /dev/nvidia-caps nodes
// (dynamic on a real host, where /proc/devices lists it as nvidia-caps).
const CapsMajor = 509

// Minors of the real driver's static capability table (nv-caps.c): 0 is
// NVLink's fabric-mgmt, 1 and 2 MIG's config and monitor, then per GPU
// minor 15 GPU instances, each its access file and then 8 compute
// instances'.
const (
	configMinor  = 1
	monitorMinor = 2
	firstGPUCap  = 3
	capsPerGI    = 1 + 8
	capsPerGPU   = 15 * capsPerGI
)

func giMinor(gpuMinor, gi int) int { return firstGPUCap + gpuMinor*capsPerGPU + gi*capsPerGI }

func ciMinor(gpuMinor, gi, ci int) int { return giMinor(gpuMinor, gi) + 1 + ci }

// DeviceFileMode values the driver prints: config is root's alone (0400),
// monitor and the instances' access readable by all (0444).
const (
	modeRootOnly = 0o400
	modeAll      = 0o444
)

func accessFile(minor, mode int) []byte {
	return fmt.Appendf(nil, "DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n", minor, mode)
}

// procFiles are the simulated driver's procfs files at this moment, keyed
// by their path under / without the leading slash.
func (n *Node) procFiles() map[string][]byte {
	rel := func(p string) string { return strings.TrimPrefix(p, "/") }
	files := map[string][]byte{
		rel(nvcaps.DevicesFile): fmt.Appendf(nil, "Character devices:\n%3d nvidia-frontend\n%3d nvidia-uvm\n%3d %s\n\nBlock devices:\n  7 loop\n", gpu.NVIDIAMajor, UVMMajor, CapsMajor, nvcaps.MajorName),
		rel(nvcaps.ConfigFile):  accessFile(configMinor, modeRootOnly),
		rel(nvcaps.MonitorFile): accessFile(monitorMinor, modeAll),
	}
	for _, d := range n.server.Devices {
		dev := d.(*server.Device)
		if mode, _, _ := dev.GetMigMode(); mode != nvml.DEVICE_MIG_ENABLE {
			continue
		}
		// A GI's file exists from its creation, before it holds any CI.
		for _, h := range placements(dev) {
			files[rel(nvcaps.GPUInstanceFile(dev.Minor, h.id))] = accessFile(giMinor(dev.Minor, h.id), modeAll)
		}
		for _, in := range instances(dev) {
			files[rel(nvcaps.ComputeInstanceFile(dev.Minor, in.giID, in.ciID))] = accessFile(ciMinor(dev.Minor, in.giID, in.ciID), modeAll)
		}
	}
	return files
}

// ProcFS is the simulated driver's procfs, its root standing for /:
// /proc/devices and the MIG capability files of the instances that exist
// when a file is opened, as the real driver writes them (shared/gpu/nvcaps
// reads them). Served from the simulated NVML's own state, it never lags a
// layout change. It holds files only; directories do not open.
func (n *Node) ProcFS() fs.FS { return procFS{n} }

type procFS struct{ n *Node }

func (p procFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	data, ok := p.n.procFiles()[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return &procFile{Reader: bytes.NewReader(data), info: procInfo{name: path.Base(name), size: int64(len(data))}}, nil
}

type procFile struct {
	*bytes.Reader
	info procInfo
}

func (f *procFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *procFile) Close() error               { return nil }

type procInfo struct {
	name string
	size int64
}

func (i procInfo) Name() string       { return i.name }
func (i procInfo) Size() int64        { return i.size }
func (i procInfo) Mode() fs.FileMode  { return 0o444 }
func (i procInfo) ModTime() time.Time { return time.Time{} }
func (i procInfo) IsDir() bool        { return false }
func (i procInfo) Sys() any           { return nil }

// WriteProc writes the simulated driver's procfs files, as ProcFS serves
// them now, into the driver root dir: a simulated root then carries the
// capability files of its MIG layout. Capability files of instances that
// no longer exist are removed.
func (n *Node) WriteProc(dir string) error {
	caps := filepath.Join(dir, nvcaps.Dir)
	if err := os.RemoveAll(caps); err != nil {
		return fmt.Errorf("clear the simulated capability files in %s: %w", caps, err)
	}
	for name, data := range n.procFiles() {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("write the simulated %s: %w", p, err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return fmt.Errorf("write the simulated %s: %w", p, err)
		}
	}
	return nil
}
