//go:build nosim

package main

import (
	"time"

	"github.com/nvinject/nvinject/nri/internal/conn"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/shared/httpserve"
)

// simulationFaults: a release build has none. It is never made there, as
// --nvml=sim:... fails when the backend opens it, before the handler.
type simulationFaults struct{ *plugin.Handler }

func newSimulationFaults(h *plugin.Handler, _ time.Duration) *simulationFaults {
	return &simulationFaults{h}
}

func (*simulationFaults) serve(*httpserve.Server, *conn.Runner) {}
