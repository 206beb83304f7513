// Package nvcaps reads the NVIDIA driver's capability files: the procfs
// entries through which the driver says which /dev/nvidia-caps/nvidia-capN
// node grants MIG's config and monitor capabilities and each GPU instance
// and compute instance. Its one job is to turn those files into device
// nodes; it reads them from an fs.FS so the same parser serves the host's
// /proc and the SIMULATED driver's.
//
// The layout, as the driver (open-gpu-kernel-modules, kernel-open/nvidia/
// nv-caps.c) writes it and nvidia-container-toolkit (internal/nvcaps) reads it:
//
//	/proc/driver/nvidia/capabilities/mig/config                  nvidia-cap1
//	/proc/driver/nvidia/capabilities/mig/monitor                 nvidia-cap2
//	/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<GI>/access
//	/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<GI>/ci<CI>/access
//
// each holding "DeviceFileMinor: N" (and DeviceFileMode, DeviceFileModify),
// where <minor> is the GPU's /dev/nvidia<minor>. The node is
// /dev/nvidia-caps/nvidia-cap<N>, a character device on the major that
// /proc/devices lists as "nvidia-caps".
package nvcaps

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"

	"github.com/nvinject/nvinject/shared/gpu"
)

// Files the driver exposes, as absolute paths on the host.
const (
	Dir         = "/proc/driver/nvidia/capabilities"
	ConfigFile  = Dir + "/mig/config"
	MonitorFile = Dir + "/mig/monitor"
	DevicesFile = "/proc/devices"
	// DevDir holds the nodes; MajorName is their /proc/devices name.
	DevDir    = "/dev/nvidia-caps"
	MajorName = "nvidia-caps"
)

// GPUInstanceFile is the access file of GPU instance gi on the GPU whose
// device node is /dev/nvidia<gpuMinor>.
func GPUInstanceFile(gpuMinor, gi int) string {
	return fmt.Sprintf("%s/gpu%d/mig/gi%d/access", Dir, gpuMinor, gi)
}

// ComputeInstanceFile is the access file of compute instance ci in GPU
// instance gi on the GPU whose device node is /dev/nvidia<gpuMinor>.
func ComputeInstanceFile(gpuMinor, gi, ci int) string {
	return fmt.Sprintf("%s/gpu%d/mig/gi%d/ci%d/access", Dir, gpuMinor, gi, ci)
}

// Bounds on what is read: a real access file is under 100 bytes and
// /proc/devices a few KiB, so anything far larger is not what it claims.
const (
	maxAccessSize  = 4 << 10
	maxDevicesSize = 64 << 10
)

// Linux's MINORBITS and the 12 bits of a major.
const (
	maxMinor = 1<<20 - 1
	maxMajor = 1<<12 - 1
)

// ErrNotCaps is wrapped by errors for content that is not a capability
// file (or not /proc/devices).
var ErrNotCaps = errors.New("not a capability file")

// ParseAccess returns the DeviceFileMinor an access file's content names.
// Other keys are ignored; the key must appear once.
func ParseAccess(data []byte) (int64, error) {
	minor, seen := int64(0), false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return 0, fmt.Errorf("%w: line %q is not \"Key: value\"", ErrNotCaps, line)
		}
		if strings.TrimSpace(k) != "DeviceFileMinor" {
			continue
		}
		if seen {
			return 0, fmt.Errorf("%w: DeviceFileMinor is given twice", ErrNotCaps)
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
		if err != nil || n > maxMinor {
			return 0, fmt.Errorf("%w: DeviceFileMinor %q is not a minor number (0 to %d)", ErrNotCaps, strings.TrimSpace(v), maxMinor)
		}
		minor, seen = int64(n), true
	}
	if !seen {
		return 0, fmt.Errorf("%w: no DeviceFileMinor line", ErrNotCaps)
	}
	return minor, nil
}

// ParseMajor returns the major /proc/devices content gives the character
// device name; ok is false when the name is not listed.
func ParseMajor(data []byte, name string) (major int64, ok bool, err error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	inChar := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "Character devices:":
			inChar = true
			continue
		case line == "" || strings.HasSuffix(line, "devices:"):
			inChar = false
			continue
		case !inChar:
			continue
		}
		num, dev, found := strings.Cut(line, " ")
		if !found {
			return 0, false, fmt.Errorf("%w: /proc/devices line %q is not \"major name\"", ErrNotCaps, line)
		}
		if strings.TrimSpace(dev) != name {
			continue
		}
		n, err := strconv.ParseUint(num, 10, 32)
		if err != nil || n > maxMajor {
			return 0, false, fmt.Errorf("%w: /proc/devices gives %s the major %q, not a number from 0 to %d", ErrNotCaps, name, num, maxMajor)
		}
		return int64(n), true, nil
	}
	if err := sc.Err(); err != nil {
		return 0, false, fmt.Errorf("%w: /proc/devices: %w", ErrNotCaps, err)
	}
	return 0, false, nil
}

// Reader resolves capability files to device nodes, reading the
// nvidia-caps major once.
type Reader struct {
	fsys  fs.FS
	where string
	major int64
	known bool
}

// New reads the files from fsys, whose root stands for the host's /; where
// names it in errors ("the host's /", "the SIMULATED driver").
func New(fsys fs.FS, where string) *Reader { return &Reader{fsys: fsys, where: where} }

// Node returns the /dev/nvidia-caps node the access file (an absolute path
// such as GPUInstanceFile's) names.
func (r *Reader) Node(file string) (gpu.DeviceNode, error) {
	data, err := r.read(file, maxAccessSize)
	if err != nil {
		return gpu.DeviceNode{}, fmt.Errorf("%w; the NVIDIA driver writes it for each MIG capability that exists: check that this process sees the host's /proc/driver/nvidia (not masked by the container runtime) and that the instance still exists (nvidia-smi mig -lgi; nvidia-smi mig -lci)", err)
	}
	minor, err := ParseAccess(data)
	if err != nil {
		return gpu.DeviceNode{}, fmt.Errorf("read %s (%s): %w", file, r.where, err)
	}
	major, err := r.capsMajor()
	if err != nil {
		return gpu.DeviceNode{}, err
	}
	return gpu.DeviceNode{Path: fmt.Sprintf("%s/nvidia-cap%d", DevDir, minor), Type: "c", Major: major, Minor: minor}, nil
}

func (r *Reader) capsMajor() (int64, error) {
	if r.known {
		return r.major, nil
	}
	data, err := r.read(DevicesFile, maxDevicesSize)
	if err != nil {
		return 0, fmt.Errorf("%w; /proc/devices lists the nvidia-caps major", err)
	}
	major, ok, err := ParseMajor(data, MajorName)
	if err != nil {
		return 0, fmt.Errorf("read %s (%s): %w", DevicesFile, r.where, err)
	}
	if !ok {
		return 0, fmt.Errorf("%s (%s) lists no %s character device: the NVIDIA kernel module registers it when it loads (driver 450 or later); check `lsmod | grep nvidia` and dmesg on the host", DevicesFile, r.where, MajorName)
	}
	r.major, r.known = major, true
	return major, nil
}

// read returns file's content, refusing more than limit bytes.
func (r *Reader) read(file string, limit int64) ([]byte, error) {
	f, err := r.fsys.Open(strings.TrimPrefix(file, "/"))
	if err != nil {
		return nil, fmt.Errorf("read %s (%s): %w", file, r.where, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s (%s): %w", file, r.where, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("read %s (%s): %w: larger than %d bytes", file, r.where, ErrNotCaps, limit)
	}
	return data, nil
}
