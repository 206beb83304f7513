package evidence

import (
	"time"

	"github.com/nvinject/nvinject/shared/contract"
)

// ExplainEvidence is what `nvinject-doctor explain POD` reads about one pod:
// the pod as it is now, its claims, the audit Events nvinject-nri recorded
// on it and the state of nvinject-nri on its node.
type ExplainEvidence struct {
	Pod PodRef `json:"pod"`
	// Unread: the pod itself could not be read; nothing else is then.
	Unread       string    `json:"unread,omitempty"`
	UID          string    `json:"uid,omitempty"`
	Node         string    `json:"node,omitempty"`
	Phase        string    `json:"phase,omitempty"`
	RuntimeClass string    `json:"runtimeClass,omitempty"`
	Created      time.Time `json:"created"`
	// Unscheduled is the scheduler's message while the pod has no node.
	Unscheduled string `json:"unscheduled,omitempty"`
	// Resource is the extended resource the GPU requests name.
	Resource   string             `json:"resource"`
	Containers []ExplainContainer `json:"containers,omitempty"`
	// Claims are the pod's ResourceClaims with their allocation.
	Claims       []Claim `json:"claims,omitempty"`
	ClaimsUnread string  `json:"claimsUnread,omitempty"`
	// Records are nvinject-nri's audit Events on the pod, oldest first.
	Records       []AuditRecord `json:"records,omitempty"`
	RecordsUnread string        `json:"recordsUnread,omitempty"`
	NRI           ExplainNRI    `json:"nri"`
	// Now is when the evidence was read (Events expire after the API
	// server's --event-ttl).
	Now time.Time `json:"now"`
}

// ExplainContainer is one container of the pod: what its spec asks for and
// its status now.
type ExplainContainer struct {
	Name string `json:"name"`
	Init bool   `json:"init,omitempty"`
	// GPUs is its request (or limit) of the resource; Claims the claims
	// it uses: its spec's resources.claims and the scheduler's claim for
	// its extended resource (KEP-5004).
	GPUs    int64      `json:"gpus"`
	Claims  []ClaimRef `json:"claims,omitempty"`
	State   string     `json:"state,omitempty"`
	Reason  string     `json:"reason,omitempty"`
	Message string     `json:"message,omitempty"`
	Ready   bool       `json:"ready"`
	// Started: the runtime created it at least once (it has a container ID).
	Started bool `json:"started"`
}

// ClaimRef is a ResourceClaim (by its object's name) and, when only part
// of it is the container's, the request.
type ClaimRef struct {
	Claim   string `json:"claim"`
	Request string `json:"request,omitempty"`
}

func (r ClaimRef) String() string {
	if r.Request == "" {
		return r.Claim
	}
	return r.Claim + " request " + r.Request
}

// AuditRecord is one audit Event: its verdict (Reason), how often it was
// counted and its note, parsed.
type AuditRecord struct {
	Reason string             `json:"reason"`
	Count  int32              `json:"count"`
	First  time.Time          `json:"first"`
	Last   time.Time          `json:"last"`
	Host   string             `json:"host,omitempty"`
	Note   contract.AuditNote `json:"note"`
	// Unparsed holds a message that is not an audit note (quoted, bounded).
	Unparsed string `json:"unparsed,omitempty"`
}

// Admitted says whether the record is an admission.
func (r AuditRecord) Admitted() bool { return r.Reason == contract.EventReasonGPUAdmitted }

// ExplainNRI is nvinject-nri on the pod's node: its pod and its audit
// metrics (whether it has API access, and what it could not record).
type ExplainNRI struct {
	Pod           DaemonEvidence     `json:"pod"`
	MetricsURL    string             `json:"metricsUrl,omitempty"`
	MetricsUnread string             `json:"metricsUnread,omitempty"`
	AuditEnabled  *float64           `json:"auditEnabled,omitempty"`
	AuditOutcomes map[string]float64 `json:"auditOutcomes,omitempty"`
}
