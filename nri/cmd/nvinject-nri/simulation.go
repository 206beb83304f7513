//go:build !nosim

package main

import (
	"time"

	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/nri/internal/simfault"
	"github.com/nvinject/nvinject/shared/httpserve"
)

// simulationFaults is the SIMULATION's hold on the plugin (test and demo
// equipment): a delay before every CreateContainer and the /debug/sim/
// routes that set it and drop the connection to containerd.
type simulationFaults struct{ *simfault.Slow }

func newSimulationFaults(h *plugin.Handler, delay time.Duration) *simulationFaults {
	return &simulationFaults{simfault.NewSlow(h, delay)}
}

func (f *simulationFaults) serve(srv *httpserve.Server, runner simfault.Reconnecter) {
	for pattern, hd := range simfault.Routes(f.Slow, runner) {
		srv.Handle(pattern, hd)
	}
}
