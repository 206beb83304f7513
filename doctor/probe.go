package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nvinject/nvinject/doctor/evidence"
)

// ExecFunc runs cmd in a container and returns its stdout (also with an
// error, when the command ran and failed).
type ExecFunc func(ctx context.Context, ns, pod, container string, cmd ...string) (string, error)

// runProbe runs the probe in a container and reads its JSON report; a
// container without the probe (most images) gives Unread, never a problem.
func runProbe(ctx context.Context, exec ExecFunc, ns, pod, container string, cmd []string) *evidence.ProbeResult {
	out, err := exec(ctx, ns, pod, container, cmd...)
	var r struct {
		Libraries []evidence.ProbeLib    `json:"libraries"`
		Calls     []evidence.ProbeCallRC `json:"calls"`
		AllLoaded bool                   `json:"all_loaded"`
	}
	if jerr := json.Unmarshal([]byte(out), &r); jerr != nil || len(r.Libraries) == 0 {
		why := fmt.Sprintf("%s gave no report", strings.Join(cmd, " "))
		if err != nil {
			why = fmt.Sprintf("%s: %v", why, err)
		}
		if len(why) > maxDaemonMessage {
			why = why[:maxDaemonMessage] + "…"
		}
		return &evidence.ProbeResult{Unread: why}
	}
	return &evidence.ProbeResult{AllLoaded: r.AllLoaded, Libraries: r.Libraries, Calls: r.Calls}
}

// cuInitNoDevice is CUDA_ERROR_NO_DEVICE: the libraries work, no GPU is
// visible to CUDA (as without a kernel module, on a simulated node).
const cuInitNoDevice = 100

// probeFindings adds what the probe says to the application layer: a
// library that does not load, or a cuInit failure other than "no device",
// is the seed's last row (driver/user-space compatibility).
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
