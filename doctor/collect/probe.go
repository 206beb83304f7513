package collect

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nvinject/nvinject/doctor/evidence"
)

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
