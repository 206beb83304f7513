// Package layouts tests nvinject's CDI spec on the driver layouts real GPU hosts have,
// each built from NVIDIA's real driver packages (e2e/harness/driverroot) with a SIMULATED GPU,
// by running a container under runc: its real nvidia-smi, ldconfig -p and cuInit, beside
// the same container given NVIDIA's nvidia-ctk spec. The package holds only its test.
package layouts
