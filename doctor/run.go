package doctor

import (
	"context"
	"errors"
	"io"

	"github.com/nvinject/nvinject/doctor/check"
	"github.com/nvinject/nvinject/doctor/collect"
	"github.com/nvinject/nvinject/doctor/render"
)

// The names in-process callers (e2e/tests/scenarios, e2e/tests/cluster) read a report
// by, so they need not know which pipeline package defines each.
type (
	Options = collect.Options
	Report  = check.Report
	Layer   = check.Layer
)

// Verdicts and layers, as check defines them.
const (
	OK      = check.OK
	Broken  = check.Broken
	Unknown = check.Unknown

	LayerDriver       = check.LayerDriver
	LayerRegistration = check.LayerRegistration
	LayerHealth       = check.LayerHealth
	LayerScheduling   = check.LayerScheduling
	LayerAllocate     = check.LayerAllocate
	LayerInjection    = check.LayerInjection
	LayerCDIRuntime   = check.LayerCDIRuntime
	LayerApplication  = check.LayerApplication
)

// Run collects the evidence o points at and evaluates every layer. The
// error is only for a cancelled context; unreadable inputs become
// "unknown" verdicts.
func Run(ctx context.Context, o Options) (Report, error) {
	o = o.WithDefaults()
	e := collect.Node(ctx, o)
	if err := ctx.Err(); err != nil {
		return Report{}, err
	}
	return Report{Node: e.Node, Time: o.Now().UTC(), Verdicts: check.Evaluate(e), Evidence: e}, nil
}

// RunExplain collects the evidence for pod name and explains it. The error
// is for a cancelled context or a pod that could not be read.
func RunExplain(ctx context.Context, o Options, name string) (check.ExplainReport, error) {
	e := collect.Pod(ctx, o, name)
	if err := ctx.Err(); err != nil {
		return check.ExplainReport{}, err
	}
	if e.Unread != "" {
		return check.ExplainReport{Evidence: e}, errors.New(e.Unread)
	}
	return check.ExplainReport{Explanation: check.Explain(e), Evidence: e}, nil
}

// WriteTable writes r as the human table, as the command does.
func WriteTable(w io.Writer, r Report) error { return render.WriteTable(w, r) }
