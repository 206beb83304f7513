package contract

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// The audit trail: nvinject-nri records its verdict on each GPU container
// as a Kubernetes Event on the pod; nvinject-doctor explain reads it back.
const (
	// EventReasonGPUAdmitted (type Normal) and EventReasonGPURefused (type
	// Warning) are the Events' reasons.
	EventReasonGPUAdmitted = "GPUAdmitted"
	EventReasonGPURefused  = "GPURefused"
	// EventSource is the Events' source component and reporting controller.
	EventSource = "nvinject-nri"
)

// MetricNRIAuditEvents counts the audit Events by label outcome, one of
// the AuditOutcome values.
const MetricNRIAuditEvents = "nvinject_nri_audit_events_total"

// MetricNRIAuditEnabled is 1 while nvinject-nri has an API client to record
// audit Events with, 0 when it runs without one (log lines only).
const MetricNRIAuditEnabled = "nvinject_nri_audit_events_enabled"

// Values of MetricNRIAuditEvents' outcome label.
const (
	AuditSent        = "sent"         // created, or counted on an earlier Event
	AuditQueueFull   = "queue-full"   // dropped: the queue to the API was full
	AuditRateLimited = "rate-limited" // dropped by the per-pod spam filter
	AuditFailed      = "failed"       // the API server did not take it
)

// MaxAuditNote bounds an audit Event's message: well under the 1 KiB the
// events.k8s.io API allows a note, leaving room for the aggregator's
// "(combined from similar events): " prefix.
const MaxAuditNote = 900

// auditCombined is the prefix client-go's aggregator puts on a message
// that stands for several similar Events.
const auditCombined = "(combined from similar events): "

// AuditNote is an audit Event's message: what nvinject-nri checked for one
// container, field by field, as text a person reads in `kubectl describe
// pod` and the doctor parses back.
type AuditNote struct {
	Container string
	// Assigned is kubelet's assignment: device-plugin IDs or DRA claims.
	Assigned string
	// CDI are the container's CDI device names.
	CDI string
	// Checked are the GPU device nodes, mounts and UUID environment found
	// in the final container.
	Checked string
	// Verdict is "admitted …" or "refused <reason>: <why>".
	Verdict string
	// Combined is set when client-go aggregated similar Events into this one.
	Combined bool
}

var auditLabels = [...]string{"container: ", "assigned: ", "cdi: ", "checked: ", "verdict: "}

// Budgets of the fields before the verdict, which gets what is left.
var auditBudgets = [...]int{64, 200, 200, 240}

// String renders the note within MaxAuditNote bytes. The fields before the
// verdict cannot contain "; " (a ';' becomes ','), so the note parses back
// whatever the verdict says.
func (n AuditNote) String() string {
	var b strings.Builder
	for i, v := range []string{n.Container, n.Assigned, n.CDI, n.Checked} {
		b.WriteString(auditLabels[i])
		b.WriteString(Cut(flat(strings.ReplaceAll(v, ";", ",")), auditBudgets[i]))
		b.WriteString("; ")
	}
	b.WriteString(auditLabels[4])
	b.WriteString(Cut(flat(n.Verdict), MaxAuditNote-b.Len()))
	return b.String()
}

// ParseAuditNote reads a note String wrote, also when client-go's
// aggregator prefixed it. The note comes from the API server, so anything
// else is an error, never a panic.
func ParseAuditNote(s string) (AuditNote, error) {
	var n AuditNote
	if rest, ok := strings.CutPrefix(s, auditCombined); ok {
		s, n.Combined = rest, true
	}
	parts := strings.SplitN(s, "; ", len(auditLabels))
	if len(parts) != len(auditLabels) {
		return AuditNote{}, fmt.Errorf("audit note %s has %d of its %d fields", Quote(s), len(parts), len(auditLabels))
	}
	fields := []*string{&n.Container, &n.Assigned, &n.CDI, &n.Checked, &n.Verdict}
	for i, p := range parts {
		v, ok := strings.CutPrefix(p, auditLabels[i])
		if !ok {
			return AuditNote{}, fmt.Errorf("audit note %s: field %d does not start with %q", Quote(s), i+1, auditLabels[i])
		}
		*fields[i] = v
	}
	return n, nil
}

// Cut returns s within max bytes: longer text is cut at a rune boundary
// and the cut counted.
func Cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	// The marker's digits never outnumber those of len(s).
	keep := max - len(fmt.Sprintf("…(%d more bytes)", len(s)))
	if keep <= 0 {
		return ""
	}
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return fmt.Sprintf("%s…(%d more bytes)", s[:keep], len(s)-keep)
}

// flat puts s on one line.
func flat(s string) string {
	if !strings.ContainsAny(s, "\n\r") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}
