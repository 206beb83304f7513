package check

import (
	"time"

	"github.com/nvinject/nvinject/doctor/evidence"
)

// Status is a layer's verdict.
type Status string

// Verdicts. Unknown means an input the layer needs could not be read; it is
// never reported as OK.
const (
	OK      Status = "ok"
	Broken  Status = "broken"
	Unknown Status = "unknown"
)

// Layer names one row of the GPU troubleshooting table. The names are
// part of the JSON output and stay stable.
type Layer string

// The layers, in the order the chain is walked.
const (
	LayerDriver       Layer = "driver"
	LayerRegistration Layer = "registration"
	LayerHealth       Layer = "health"
	LayerScheduling   Layer = "scheduling"
	LayerAllocate     Layer = "allocate"
	LayerInjection    Layer = "injection"
	LayerCDIRuntime   Layer = "cdi-runtime"
	LayerApplication  Layer = "application"
)

// Verdict is one layer's result.
type Verdict struct {
	Layer   Layer  `json:"layer"`
	Symptom string `json:"symptom"`
	Status  Status `json:"status"`
	// Evidence is what was read, one fact a line.
	Evidence []string `json:"evidence"`
	// Fix is what to do; empty when the layer is ok.
	Fix string `json:"fix,omitempty"`
}

// Report is one doctor run.
type Report struct {
	Node     string    `json:"node"`
	Time     time.Time `json:"time"`
	Verdicts []Verdict `json:"verdicts"`
	// Evidence is the raw input of the checks, for machines and bug reports.
	Evidence evidence.Evidence `json:"evidence"`
}

// Broken returns the layers whose verdict is broken.
func (r Report) Broken() []Layer {
	var out []Layer
	for _, v := range r.Verdicts {
		if v.Status == Broken {
			out = append(out, v.Layer)
		}
	}
	return out
}

// Verdict returns the verdict of layer l.
func (r Report) Verdict(l Layer) (Verdict, bool) {
	for _, v := range r.Verdicts {
		if v.Layer == l {
			return v, true
		}
	}
	return Verdict{}, false
}
