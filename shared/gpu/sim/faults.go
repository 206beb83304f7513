//go:build !nosim

package sim

import (
	"fmt"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Fault is an injectable SIMULATED health fault of one GPU, read back
// through the NVML queries a device plugin asks before trusting a GPU.
type Fault string

// The simulated faults.
const (
	// FaultLost: the GPU stops answering; NVML queries on it return
	// GPU_IS_LOST (a GPU that fell off the bus).
	FaultLost Fault = "lost"
	// FaultRetiredPagesPending: nvmlDeviceGetRetiredPagesPendingStatus
	// reports pages waiting for retirement.
	FaultRetiredPagesPending Fault = "retired-pages-pending"
	// FaultRowRemapFailure: nvmlDeviceGetRemappedRows reports a failure.
	FaultRowRemapFailure Fault = "row-remap-failure"
	// FaultRowRemapPending: nvmlDeviceGetRemappedRows reports a pending remap.
	FaultRowRemapPending Fault = "row-remap-pending"
	// FaultECC adds one volatile uncorrected ECC error; the counter is
	// volatile, so it stays until the (simulated) driver reloads.
	FaultECC Fault = "ecc"
)

var faults = []Fault{FaultLost, FaultRetiredPagesPending, FaultRowRemapFailure, FaultRowRemapPending, FaultECC}

// ParseFault reads a fault name.
func ParseFault(s string) (Fault, error) {
	for _, f := range faults {
		if string(f) == s {
			return f, nil
		}
	}
	names := make([]string, len(faults))
	for i, f := range faults {
		names[i] = string(f)
	}
	return "", fmt.Errorf("unknown simulated fault %q; known: %s", s, strings.Join(names, ", "))
}

type deviceFaults struct {
	lost, retiredPending, remapFailure, remapPending bool
	ecc                                              uint64
}

type faultTable struct {
	mu   sync.Mutex
	byID map[string]*deviceFaults
}

func (t *faultTable) get(uuid string) deviceFaults {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.byID[uuid]; f != nil {
		return *f
	}
	return deviceFaults{}
}

// InjectFault sets fault f on the simulated GPU with uuid.
func (n *Node) InjectFault(uuid string, f Fault) error {
	if err := n.known(uuid); err != nil {
		return err
	}
	n.faults.mu.Lock()
	defer n.faults.mu.Unlock()
	d := n.faults.byID[uuid]
	if d == nil {
		d = &deviceFaults{}
		n.faults.byID[uuid] = d
	}
	switch f {
	case FaultLost:
		d.lost = true
	case FaultRetiredPagesPending:
		d.retiredPending = true
	case FaultRowRemapFailure:
		d.remapFailure = true
	case FaultRowRemapPending:
		d.remapPending = true
	case FaultECC:
		d.ecc++
	default:
		return fmt.Errorf("inject fault on %s: %w", uuid, errUnknownFault(f))
	}
	return nil
}

// ClearFaults ends the GPU's lost, retired-page and row-remap faults, as
// a GPU reset would; the volatile ECC count stays.
func (n *Node) ClearFaults(uuid string) error {
	if err := n.known(uuid); err != nil {
		return err
	}
	n.faults.mu.Lock()
	defer n.faults.mu.Unlock()
	if d := n.faults.byID[uuid]; d != nil {
		*d = deviceFaults{ecc: d.ecc}
	}
	return nil
}

func errUnknownFault(f Fault) error {
	_, err := ParseFault(string(f))
	return err
}

func (n *Node) known(uuid string) error {
	for _, u := range n.uuids() {
		if u == uuid {
			return nil
		}
	}
	return fmt.Errorf("simulated GPU %s does not exist; simulated UUIDs: %s", uuid, strings.Join(n.uuids(), ", "))
}

// wireHealthQueries answers the NVML health queries from the fault table.
func (n *Node) wireHealthQueries(dev *server.Device) {
	dev.GetUUIDFunc = func() (string, nvml.Return) {
		if n.faults.get(dev.UUID).lost {
			return "", nvml.ERROR_GPU_IS_LOST
		}
		return dev.UUID, nvml.SUCCESS
	}
	dev.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		f := n.faults.get(dev.UUID)
		switch {
		case f.lost:
			return 0, nvml.ERROR_GPU_IS_LOST
		case f.retiredPending:
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	dev.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		f := n.faults.get(dev.UUID)
		if f.lost {
			return 0, 0, false, false, nvml.ERROR_GPU_IS_LOST
		}
		unc := 0
		if f.remapFailure || f.remapPending {
			unc = 1
		}
		return 0, unc, f.remapPending, f.remapFailure, nvml.SUCCESS
	}
	dev.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
		f := n.faults.get(dev.UUID)
		switch {
		case f.lost:
			return 0, nvml.ERROR_GPU_IS_LOST
		case t == nvml.MEMORY_ERROR_TYPE_UNCORRECTED && c == nvml.VOLATILE_ECC:
			return f.ecc, nvml.SUCCESS
		}
		return 0, nvml.SUCCESS
	}
}
