//go:build !nosim

package gpunode

import (
	"github.com/nvinject/nvinject/gpunode/simdebug"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// simulation is the one place the kubelet plugins' GPU node takes on the
// SIMULATION (test and demo equipment): under --nvml=sim:... the seam of
// gpunode/simdebug opens the simulated NVML, serves its fault routes
// (/debug/sim/...) on the metrics address and learns the health tracker,
// all through the Node's generic options. A real node gets none of it:
// no /debug/sim/ route (404).
func simulation(nvml string) []Option {
	if !sim.IsSim(nvml) {
		return nil
	}
	seam := simdebug.New()
	return []Option{WithOpen(seam.Open), WithRoutes(seam.Routes()), WithOnPublish(func(g GPUs) { seam.Track(g.Health) })}
}
