package scale

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what one run measured.
type Report struct {
	Nodes int `json:"nodes"`
	// GPUs is every node's GPUs together.
	GPUs int `json:"gpus"`
	// ControlPlaneUp is how long the control plane took to come up.
	ControlPlaneUp Duration `json:"controlPlaneUp"`
	// NodesReady is from the first Node created to every node Ready (KWOK).
	NodesReady Duration `json:"nodesReady"`
	// SlicePublish is from the first ResourceSlice controller started, with no
	// slice in the cluster, to every DRA node's slice seen; SliceP50 is when half were.
	SlicePublish Duration `json:"slicePublish"`
	SliceP50     Duration `json:"sliceP50"`
	DRANodes     int      `json:"draNodes"`
	Phases       []Phase  `json:"phases"`
	// Storm is the health storm's figures; nil without one.
	Storm *Storm `json:"storm,omitempty"`
	// EtcdDBBytes is etcd's database size at the end, EtcdDBInUseBytes the part in use.
	EtcdDBBytes      int64     `json:"etcdDBBytes"`
	EtcdDBInUseBytes int64     `json:"etcdDBInUseBytes"`
	Memory           []Process `json:"memory"`
	Took             Duration  `json:"took"`
}

// Phase is one stretch of the run: node creation, slice publication, the fill to
// 90 %, the churn.
type Phase struct {
	Name     string   `json:"name"`
	Duration Duration `json:"duration"`
	Paths    []Path   `json:"paths,omitempty"`
	// Scheduled is the pods the scheduler bound in the phase (its
	// scheduler_schedule_attempts_total{result="scheduled"}), Throughput per second.
	Scheduled  int64   `json:"scheduled,omitempty"`
	Throughput float64 `json:"throughput,omitempty"`
	// Unschedulable is the scheduler's attempts that found no node.
	Unschedulable int64 `json:"unschedulable,omitempty"`
	// Requests are the API server's requests in the phase (apiserver_request_total).
	Requests      Requests `json:"requests"`
	RequestsTotal int64    `json:"requestsTotal"`
}

// Path is one way to a GPU's pods in a phase.
type Path struct {
	Name string `json:"name"`
	Pods int    `json:"pods"`
	// Claims is the allocated ResourceClaims of the path's pods at the phase's end.
	Claims    int     `json:"claims"`
	Scheduled Latency `json:"scheduled"`
	Running   Latency `json:"running"`
}

// Latency is a distribution from pod creation.
type Latency struct {
	P50 Duration `json:"p50"`
	P99 Duration `json:"p99"`
	Max Duration `json:"max"`
}

// Process is one program's memory.
type Process struct {
	Name      string `json:"name"`
	RSSBytes  int64  `json:"rssBytes"`
	PeakBytes int64  `json:"peakBytes"`
}

// RequestCount is one verb on one resource and how often.
type RequestCount struct {
	Request string
	Count   int64
}

// Duration prints and encodes as a Go duration in milliseconds.
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).Round(time.Millisecond).String() }

// MarshalText writes the duration as "1.234s".
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

func latency(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) Duration { return Duration(s[min(len(s)-1, int(p*float64(len(s))))]) }
	return Latency{P50: q(0.50), P99: q(0.99), Max: Duration(s[len(s)-1])}
}

// Write prints the report as tables.
func (r Report) Write(w io.Writer) {
	fmt.Fprintf(w, "scale-sim: %d nodes (%d device-plugin, %d DRA), %d GPUs; took %s\n",
		r.Nodes, r.Nodes-r.DRANodes, r.DRANodes, r.GPUs, r.Took)
	fmt.Fprintf(w, "control plane up %s; nodes Ready %s; ResourceSlices of %d nodes published from empty in %s (half in %s)\n\n",
		r.ControlPlaneUp, r.NodesReady, r.DRANodes, r.SlicePublish, r.SliceP50)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tpath\tpods\tclaims\tscheduled p50\tp99\tRunning p50\tp99\tmax\tscheduler pods/s\tunschedulable")
	for _, p := range r.Phases {
		for _, path := range p.Paths {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.1f\t%d\n", p.Name, path.Name, path.Pods, path.Claims,
				path.Scheduled.P50, path.Scheduled.P99, path.Running.P50, path.Running.P99, path.Running.Max, p.Throughput, p.Unschedulable)
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, p := range r.Phases {
		fmt.Fprintf(w, "API requests, %s (%s): %d, %.0f/s\n", p.Name, p.Duration, p.RequestsTotal, float64(p.RequestsTotal)/time.Duration(p.Duration).Seconds())
		var parts []string
		for _, rc := range p.Requests.Top(12) {
			parts = append(parts, fmt.Sprintf("%s %d", rc.Request, rc.Count))
		}
		fmt.Fprintf(w, "  %s\n", strings.Join(parts, ", "))
	}
	if st := r.Storm; st != nil {
		st.write(w)
	}
	fmt.Fprintf(w, "\netcd db %s (%s in use)\n", mib(r.EtcdDBBytes), mib(r.EtcdDBInUseBytes))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "process\tRSS\tpeak RSS")
	for _, p := range r.Memory {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Name, mib(p.RSSBytes), mib(p.PeakBytes))
	}
	tw.Flush()
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

func (st *Storm) write(w io.Writer) {
	fmt.Fprintf(w, "\nhealth storm: %d+%d GPUs on %d device-plugin + %d DRA nodes flapping at 1 Hz (out of step) for %s, limiter interval %s, kubelet status sync %s; %d changes, %d ListAndWatch sends, %d slice updates\n",
		st.FlappingGPUs[PathDevicePlugin], st.FlappingGPUs[PathDRA], st.FlappingNodes[PathDevicePlugin], st.FlappingNodes[PathDRA],
		st.Duration, st.Interval, st.KubeletSync, st.Changes, st.Delivered[PathDevicePlugin], st.Delivered[PathDRA])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "path\twrite\tstorm\tquiet\texcess\texcess/s\tbound\twithin")
	for _, x := range st.Writes {
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.0f\t%.1f\t%d\t%t\n", x.Path, x.Request, x.Storm, x.Quiet, x.Excess, x.PerSecond, x.Bound, x.Within)
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "probe pods\tquiet p50\tp99\tstorm p50\tp99\tp50 ratio\tp99 ratio")
	for _, l := range st.Latency {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\n", l.Path, l.Quiet.P50, l.Quiet.P99, l.Storm.P50, l.Storm.P99, l.P50Ratio, l.P99Ratio)
	}
	tw.Flush()
	fmt.Fprintf(w, "GPUs in a wrong state after the storm: %d (settled in %s)\n", st.Wrong, st.Settled)
}
