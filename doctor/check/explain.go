package check

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

// Explanation is the chain for one pod, per container: what its spec asks
// for, what kubelet assigned, the CDI names, what nvinject-nri checked in
// the final container and its verdict, from nvinject-nri's audit Events and
// the live objects; or, without a record, why there is none.
type Explanation struct {
	Pod string `json:"pod"`
	// Facts are about the pod as a whole: its node and phase, nvinject-nri
	// there, its claims.
	Facts      []string         `json:"facts,omitempty"`
	Containers []ContainerChain `json:"containers,omitempty"`
}

// ContainerChain is one container's chain.
type ContainerChain struct {
	Name  string      `json:"name"`
	Steps []ChainStep `json:"steps"`
	// NoRecord says why no audit Event explains the container.
	NoRecord string `json:"noRecord,omitempty"`
	// History are the container's earlier verdicts, oldest first.
	History []string `json:"history,omitempty"`
}

// ChainStep is one link of the chain.
type ChainStep struct {
	Label string `json:"label"`
	Text  string `json:"text"`
}

// Chain step labels, in order.
const (
	StepRequested = "requested"
	StepAllocated = "allocated"
	StepKubelet   = "kubelet assigned"
	StepCDI       = "CDI names"
	StepChecked   = "checked"
	StepVerdict   = "verdict"
	StepNow       = "now"
)

// eventTTL is the API server's default --event-ttl: older Events are gone.
const eventTTL = time.Hour

// ExplainReport is one explain run: the chain and the evidence it came from.
type ExplainReport struct {
	Explanation Explanation              `json:"explanation"`
	Evidence    evidence.ExplainEvidence `json:"evidence"`
}

// Explain is the chain e shows; it does no I/O.
func Explain(e evidence.ExplainEvidence) Explanation {
	x := Explanation{Pod: e.Pod.String()}
	node := e.Node
	if node == "" {
		node = "no node (not scheduled)"
	}
	rc := e.RuntimeClass
	if rc == "" {
		rc = "none"
	}
	x.Facts = append(x.Facts, fmt.Sprintf("uid %s on %s: phase %s, RuntimeClass %s, created %s", orDash(e.UID), node, orDash(e.Phase), rc, e.Created.Format(time.RFC3339)))
	if e.Node != "" {
		x.Facts = append(x.Facts, "nvinject-nri: "+e.NRI.Pod.Describe()+"; "+auditState(e.NRI))
	}
	for _, c := range e.Claims {
		x.Facts = append(x.Facts, "claim "+claimText(c))
	}
	if e.ClaimsUnread != "" {
		x.Facts = append(x.Facts, "could not read the pod's claims: "+e.ClaimsUnread)
	}
	byContainer := map[string][]evidence.AuditRecord{}
	for _, r := range e.Records {
		if r.Unparsed != "" {
			x.Facts = append(x.Facts, fmt.Sprintf("audit Event %s is not an audit note: %s", r.Reason, r.Unparsed))
			continue
		}
		byContainer[r.Note.Container] = append(byContainer[r.Note.Container], r)
	}
	for _, c := range e.Containers {
		x.Containers = append(x.Containers, chain(e, c, byContainer[c.Name]))
		delete(byContainer, c.Name)
	}
	for name := range byContainer {
		x.Facts = append(x.Facts, fmt.Sprintf("audit Events name container %q, which the pod's spec does not have", name))
	}
	return x
}

func chain(e evidence.ExplainEvidence, c evidence.ExplainContainer, recs []evidence.AuditRecord) ContainerChain {
	cc := ContainerChain{Name: c.Name}
	if c.Init {
		cc.Name += " (init)"
	}
	cc.Steps = append(cc.Steps, ChainStep{StepRequested, requested(c, e.Resource)})
	if len(c.Claims) > 0 {
		cc.Steps = append(cc.Steps, ChainStep{StepAllocated, allocated(c, e.Claims)})
	}
	if len(recs) == 0 {
		cc.NoRecord = noRecordWhy(e, c)
	} else {
		last := recs[len(recs)-1]
		n := last.Note
		cc.Steps = append(cc.Steps, ChainStep{StepKubelet, n.Assigned}, ChainStep{StepCDI, n.CDI}, ChainStep{StepChecked, n.Checked},
			ChainStep{StepVerdict, verdictText(last)})
		for _, r := range recs[:len(recs)-1] {
			cc.History = append(cc.History, fmt.Sprintf("%s %s ×%d: %s", r.Last.Format(time.RFC3339), r.Reason, r.Count, contract.Cut(r.Note.Verdict, 300)))
		}
	}
	cc.Steps = append(cc.Steps, ChainStep{StepNow, nowText(c)})
	return cc
}

func requested(c evidence.ExplainContainer, resource string) string {
	var parts []string
	if c.GPUs > 0 {
		parts = append(parts, fmt.Sprintf("%s: %d", resource, c.GPUs))
	}
	for _, r := range c.Claims {
		parts = append(parts, "claim "+r.String())
	}
	if len(parts) == 0 {
		return "no GPU (no " + resource + ", no claim)"
	}
	return strings.Join(parts, ", ")
}

// allocated is what the scheduler allocated the container's claims.
func allocated(c evidence.ExplainContainer, claims []evidence.Claim) string {
	var parts []string
	for _, r := range c.Claims {
		i := slices.IndexFunc(claims, func(cl evidence.Claim) bool { return cl.Name == r.Claim })
		switch {
		case i < 0:
			parts = append(parts, r.Claim+": not read")
		case !claims[i].Allocated:
			parts = append(parts, r.Claim+": not allocated")
		default:
			var devs []string
			for _, d := range claims[i].Devices {
				if r.Request == "" || d.Request == r.Request {
					devs = append(devs, fmt.Sprintf("request %s → %s %s", d.Request, d.Driver, d.ID()))
				}
			}
			if len(devs) == 0 {
				devs = []string{"no " + contract.DRADriver + " device"}
			}
			parts = append(parts, r.Claim+": "+strings.Join(devs, ", "))
		}
	}
	return strings.Join(parts, "; ")
}

func claimText(c evidence.Claim) string {
	s := c.String()
	if c.Extended {
		s += " (the scheduler's, for the extended resource)"
	}
	if !c.Allocated {
		return s + ": not allocated"
	}
	var devs []string
	for _, d := range c.Devices {
		devs = append(devs, fmt.Sprintf("%s %s (request %s)", d.Driver, d.ID(), d.Request))
	}
	s += ": allocated " + orNone(devs)
	if len(c.ReservedFor) > 0 {
		s += ", reserved for " + strings.Join(c.ReservedFor, " ")
	}
	return s
}

func verdictText(r evidence.AuditRecord) string {
	v := r.Note.Verdict
	if word, rest, ok := strings.Cut(v, " "); ok {
		v = strings.ToUpper(word) + " " + rest
	}
	s := fmt.Sprintf("%s (%s ×%d, last %s", v, r.Reason, r.Count, r.Last.Format(time.RFC3339))
	if r.Host != "" {
		s += ", " + contract.EventSource + " on " + r.Host
	}
	if r.Note.Combined {
		s += ", combined from similar Events"
	}
	return s + ")"
}

func nowText(c evidence.ExplainContainer) string {
	s := orDash(c.State)
	if c.State == "running" {
		s += fmt.Sprintf(", ready=%t", c.Ready)
	}
	if c.Reason != "" {
		s += " " + c.Reason
	}
	if c.Message != "" {
		s += ": " + c.Message
	}
	return s
}

// notYetCreated are kubelet's waiting reasons before it asks the runtime
// to create the container.
var notYetCreated = []string{"", "ContainerCreating", "PodInitializing"}

// requiredPluginMissing is containerd's default validator refusing a pod
// that names nvinject as required while nvinject-nri is not connected.
const requiredPluginMissing = `required plugin "` + contract.NRIPluginName + `" not present`

// noRecordWhy says why no audit Event explains container c, as certainly as
// the evidence allows.
func noRecordWhy(e evidence.ExplainEvidence, c evidence.ExplainContainer) string {
	logs := fmt.Sprintf("kubectl -n %s logs %s | grep %s", e.NRI.Pod.Namespace, orDash(e.NRI.Pod.Pod), contract.Quote(`"pod":"`+e.Pod.Namespace+"/"+e.Pod.Name+`"`))
	switch {
	case e.RecordsUnread != "":
		return "the pod's Events could not be read (" + e.RecordsUnread + "): let the doctor's user list events in " + e.Pod.Namespace
	case e.Node == "":
		return "the pod is not scheduled (" + orDash(e.Unscheduled) + "): nvinject-nri sees a container only when the runtime on its node creates it"
	case c.State == "waiting" && !c.Started && slices.Contains(notYetCreated, c.Reason):
		return "the container has not reached the runtime's CreateContainer yet (kubelet: " + orDash(c.Reason) + "): kubelet is still preparing the pod (sandbox, volumes, claims); its Events say what it waits for (kubectl describe pod)"
	case strings.Contains(c.Message, requiredPluginMissing):
		return "containerd refused the container before nvinject-nri was asked: nvinject-nri is not connected to containerd on " + e.Node + " (fail-closed); run nvinject-doctor --node-name " + e.Node + " (the injection layer says why)"
	case c.GPUs == 0 && len(c.Claims) == 0 && c.Started:
		return "the container has no GPU: nvinject-nri records GPU containers and refusals only"
	}
	var why []string
	n := e.NRI
	switch {
	case n.Pod.Known() && n.Pod.Pod == "":
		why = append(why, "no nvinject-nri pod runs on "+e.Node)
	case n.AuditEnabled != nil && *n.AuditEnabled == 0:
		why = append(why, "nvinject-nri on "+e.Node+" has no API access and records no Events (its log says \"no API server access\")")
	case n.MetricsUnread == "" && n.AuditEnabled == nil:
		why = append(why, "nvinject-nri on "+e.Node+" exports no "+contract.MetricNRIAuditEnabled+": it predates the audit trail")
	}
	if lost := lostEvents(n); lost != "" {
		why = append(why, "nvinject-nri could not record "+lost+" since it started; this container's may be among them")
	}
	if age := e.Now.Sub(e.Created); age > eventTTL {
		why = append(why, fmt.Sprintf("Events expire (the API server's --event-ttl, 1h by default) and the pod is %s old", age.Round(time.Minute)))
	}
	if n.MetricsUnread != "" {
		why = append(why, "nvinject-nri's metrics could not be read ("+n.MetricsUnread+")")
	}
	if len(why) == 0 {
		why = append(why, "no audit Event names it")
	}
	return strings.Join(why, "; ") + "; nvinject-nri's log has every verdict: " + logs
}

// auditState is nvinject-nri's audit state in one phrase.
func auditState(n evidence.ExplainNRI) string {
	switch {
	case n.MetricsUnread != "":
		return "audit metrics unread: " + n.MetricsUnread
	case n.AuditEnabled == nil:
		return "no audit metrics (a version before the audit trail)"
	case *n.AuditEnabled == 0:
		return "audit Events off: no API access"
	}
	s := fmt.Sprintf("audit Events on, %v sent", n.AuditOutcomes[contract.AuditSent])
	if lost := lostEvents(n); lost != "" {
		s += ", not recorded " + lost
	}
	return s
}

// lostEvents counts the Events nvinject-nri dropped or could not write ("" for none).
func lostEvents(n evidence.ExplainNRI) string {
	var parts []string
	total := 0.0
	for _, o := range []string{contract.AuditQueueFull, contract.AuditRateLimited, contract.AuditFailed} {
		if v := n.AuditOutcomes[o]; v > 0 {
			parts = append(parts, fmt.Sprintf("%s %v", o, v))
			total += v
		}
	}
	if total == 0 {
		return ""
	}
	return fmt.Sprintf("%v Events (%s)", total, strings.Join(parts, ", "))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
