// Package ledger is nvinject-nri's admission ledger: which running
// container holds which GPU or MIG device, and whether one more container
// may hold its units beside them. It knows nothing of NRI, CDI or kubelet:
// the plugin turns a container into a Holder and asks Admit.
package ledger

import (
	"maps"
	"slices"
	"strings"
	"sync"
)

// Unit is a GPU or MIG device a container holds. Parent is a MIG device's
// GPU ("" for a whole GPU, or a MIG device whose parent is not known);
// Replicas is how many pods may share it (time-slicing; 0 or 1: one);
// Claim is the UID of the shared claim it is held through ("" for none);
// Share marks a GPU held through a claim's GPU share, Admin one held
// through a claim with admin access (a monitor).
type Unit struct {
	UUID, Parent string
	Replicas     int
	Claim        string
	Share, Admin bool
}

// Clashes reports whether u and o cannot serve two pods: the same GPU or
// MIG device, or a whole GPU and a MIG device on it. MIG devices of one
// GPU can; a shared device can serve up to its replicas (OverShared); the
// pods of one shared claim share its devices; the pods of GPU shares share
// their GPU (the scheduler keeps the shares within its capacity), never
// with a pod holding it whole. A claim with admin access (which the API
// server allows only in namespaces labeled for it) watches GPUs others hold.
func (u Unit) Clashes(o Unit) bool {
	if (u.Claim != "" && u.Claim == o.Claim) || (u.Share && o.Share) || u.Admin || o.Admin {
		return false
	}
	return (u.UUID == o.UUID && !u.Shared()) || (u.Parent != "" && u.Parent == o.UUID) || (o.Parent != "" && o.Parent == u.UUID)
}

// Shared says whether u is time-sliced among more than one pod.
func (u Unit) Shared() bool { return u.Replicas > 1 }

// OverShared finds a shared unit of mine that pods, each holding units,
// already hold up to its replicas, and who they are (sorted).
func OverShared(mine []Unit, pods map[string][]Unit) (Unit, []string, bool) {
	for _, u := range mine {
		if !u.Shared() || u.Admin {
			continue
		}
		var who []string
		for pod, us := range pods {
			if slices.ContainsFunc(us, func(o Unit) bool { return o.UUID == u.UUID && !o.Admin }) {
				who = append(who, pod)
			}
		}
		if len(who) >= u.Replicas {
			slices.Sort(who)
			return u, who, true
		}
	}
	return Unit{}, nil, false
}

// Holder is a GPU container the plugin admitted that the runtime has not
// stopped: its pod ("namespace/name" and UID), its name and its units.
type Holder struct {
	PodUID, Pod, Ctr string
	Units            []Unit
}

// SamePod: containers of one pod may share its GPU (kubelet's business).
func (h Holder) SamePod(o Holder) bool { return h.PodUID == o.PodUID && h.Pod == o.Pod }

// Clash is why Admit refused: the container holding a clashing unit (for
// an over-shared unit, no one container: Pod lists the pods that hold
// every replica and Ctr is empty), and which unit of the newcomer's clashes
// with which of theirs.
type Clash struct {
	Holder       Holder
	Mine, Theirs Unit
}

// Ledger records the running GPU containers by container ID. The zero
// Ledger is empty and ready.
type Ledger struct {
	mu    sync.Mutex
	byCtr map[string]Holder
}

// Admit records container id as holding h's units unless a container of
// another pod holds one that clashes, or a shared unit's replicas are all
// taken. Checking and recording under one lock keeps two pods created at
// once from both getting the GPU. Holders are looked at in container ID
// order, so a refusal names the same holder every time.
func (l *Ledger) Admit(id string, h Holder) (Clash, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	pods := map[string][]Unit{}
	for _, cid := range slices.Sorted(maps.Keys(l.byCtr)) {
		o := l.byCtr[cid]
		if o.SamePod(h) {
			continue
		}
		pods[o.Pod] = append(pods[o.Pod], o.Units...)
		for _, u := range h.Units {
			if i := slices.IndexFunc(o.Units, u.Clashes); i >= 0 {
				return Clash{Holder: o, Mine: u, Theirs: o.Units[i]}, false
			}
		}
	}
	if u, who, over := OverShared(h.Units, pods); over {
		return Clash{Holder: Holder{Pod: strings.Join(who, ", ")}, Mine: u, Theirs: u}, false
	}
	if l.byCtr == nil {
		l.byCtr = map[string]Holder{}
	}
	l.byCtr[id] = h
	return Clash{}, true
}

// Beside names the pods other than h's that hold a GPU or MIG device that
// h holds with admin access (or its parent or MIG devices), sorted: whom a
// monitor watches.
func (l *Ledger) Beside(h Holder) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, o := range l.byCtr {
		if o.SamePod(h) || slices.Contains(out, o.Pod) {
			continue
		}
		if slices.ContainsFunc(h.Units, func(u Unit) bool {
			return u.Admin && slices.ContainsFunc(o.Units, func(ou Unit) bool { return !ou.Admin && Unit{UUID: u.UUID, Parent: u.Parent}.Clashes(ou) })
		}) {
			out = append(out, o.Pod)
		}
	}
	slices.Sort(out)
	return out
}

// Release forgets container id: a stopped container holds nothing.
func (l *Ledger) Release(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.byCtr, id)
}

// ReleasePod forgets every container of pod's pod.
func (l *Ledger) ReleasePod(pod Holder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, h := range l.byCtr {
		if h.SamePod(pod) {
			delete(l.byCtr, id)
		}
	}
}

// Reset replaces the record with what the runtime reports running.
func (l *Ledger) Reset(byCtr map[string]Holder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byCtr = byCtr
}
