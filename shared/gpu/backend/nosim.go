//go:build nosim

package backend

import (
	"fmt"

	"github.com/nvinject/nvinject/shared/contract"
)

// Simulation says whether this build links the GPU simulation.
const Simulation = false

func openSimulated(value string, _ Options) (*Backend, error) {
	return nil, errNoSimulation(value)
}

func validateSimulated(value string) error { return errNoSimulation(value) }

func errNoSimulation(value string) error {
	return fmt.Errorf("--nvml=%s names a SIMULATED node, and this is a release build without the GPU simulation (built with the nosim tag): use --nvml=real on a GPU node, or the test and demo equipment build (make equipment) to simulate", contract.Quote(value))
}
