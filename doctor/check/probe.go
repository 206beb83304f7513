package check

import (
	"fmt"
	"strings"

	"github.com/nvinject/nvinject/doctor/evidence"
)

// cuInitNoDevice is CUDA_ERROR_NO_DEVICE: the libraries work, no GPU is
// visible to CUDA (as without a kernel module, on a simulated node).
const cuInitNoDevice = 100

// probeFindings adds what the probe says to the application layer: a
// library that does not load, or a cuInit failure other than "no device",
// is the troubleshooting table's last row (driver/user-space compatibility).
func probeFindings(ref evidence.PodRef, p *evidence.ProbeResult, f *finding) {
	switch {
	case p == nil:
	case p.Unread != "":
		f.fact("%s: no in-container probe (%s)", ref, p.Unread)
	case !p.AllLoaded:
		for _, l := range p.Libraries {
			if !l.OK {
				f.problem(fixProbeLib, "%s: %s does not load in the container (driver/user-space compatibility): %s", ref, l.Name, l.Error)
			}
		}
	default:
		var calls []string
		for _, c := range p.Calls {
			calls = append(calls, fmt.Sprintf("%s = %d %s", c.Call, c.Code, c.Name))
			if strings.HasPrefix(c.Call, "cuInit") && c.Code != 0 && c.Code != cuInitNoDevice {
				f.problem(fixApp, "%s: %s = %d %s (driver/user-space compatibility)", ref, c.Call, c.Code, c.Name)
			}
		}
		f.fact("%s: gpu-probe: all %d driver libraries load; %s", ref, len(p.Libraries), strings.Join(calls, "; "))
	}
}
