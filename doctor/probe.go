package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// ExecFunc runs cmd in a container and returns its stdout (also with an
// error, when the command ran and failed).
type ExecFunc func(ctx context.Context, ns, pod, container string, cmd ...string) (string, error)

// ProbeResult is what gpu-probe saw in an application container: which
// driver libraries loaded and what cuInit and nvmlInit returned.
type ProbeResult struct {
	Unread    string        `json:"unread,omitempty"`
	AllLoaded bool          `json:"allLoaded"`
	Libraries []ProbeLib    `json:"libraries,omitempty"`
	Calls     []ProbeCallRC `json:"calls,omitempty"`
}

// ProbeLib is one library's dlopen.
type ProbeLib struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Path  string `json:"path,omitempty"`
	Error string `json:"error,omitempty"`
}

// ProbeCallRC is one driver call's result.
type ProbeCallRC struct {
	Call string `json:"call"`
	Code int    `json:"code"`
	Name string `json:"name,omitempty"`
}

// runProbe runs the probe in a container and reads its JSON report; a
// container without the probe (most images) gives Unread, never a problem.
func runProbe(ctx context.Context, exec ExecFunc, ns, pod, container string, cmd []string) *ProbeResult {
	out, err := exec(ctx, ns, pod, container, cmd...)
	var r struct {
		Libraries []ProbeLib    `json:"libraries"`
		Calls     []ProbeCallRC `json:"calls"`
		AllLoaded bool          `json:"all_loaded"`
	}
	if jerr := json.Unmarshal([]byte(out), &r); jerr != nil || len(r.Libraries) == 0 {
		why := fmt.Sprintf("%s gave no report", strings.Join(cmd, " "))
		if err != nil {
			why = fmt.Sprintf("%s: %v", why, err)
		}
		if len(why) > maxDaemonMessage {
			why = why[:maxDaemonMessage] + "…"
		}
		return &ProbeResult{Unread: why}
	}
	return &ProbeResult{AllLoaded: r.AllLoaded, Libraries: r.Libraries, Calls: r.Calls}
}

// cuInitNoDevice is CUDA_ERROR_NO_DEVICE: the libraries work, no GPU is
// visible to CUDA (as without a kernel module, on a simulated node).
const cuInitNoDevice = 100

// probeFindings adds what the probe says to the application layer: a
// library that does not load, or a cuInit failure other than "no device",
// is the seed's last row (driver/user-space compatibility).
func probeFindings(ref PodRef, p *ProbeResult, f *finding) {
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
