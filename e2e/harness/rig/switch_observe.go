package rig

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Path names which owner's path a bound GPU pod took.
const (
	PathDRA          = "DRA"           // status.extendedResourceClaimStatus set (KEP-5004)
	PathDevicePlugin = "device plugin" // bound without an extended-resource claim
)

// PodState is what one poll of a pod showed.
type PodState struct {
	At       time.Time
	Gone     bool // the pod no longer exists
	Phase    corev1.PodPhase
	Reason   string // status.reason and message (e.g. UnexpectedAdmissionError)
	Node     string // spec.nodeName
	Path     string // PathDRA, PathDevicePlugin, or "" while unbound
	Sched    string // PodScheduled condition: status, reason and message
	Main     string // first container: running, waiting or terminated, with reason
	Restarts int32
}

// Running: the pod and its containers run.
func (s PodState) Running() bool {
	return s.Phase == corev1.PodRunning && strings.HasPrefix(s.Main, "running")
}

func (s PodState) String() string {
	if s.Gone {
		return "gone"
	}
	return fmt.Sprintf("phase=%s%s node=%q path=%q scheduled=%q container=%q restarts=%d",
		s.Phase, prefixed(" reason=", s.Reason), s.Node, s.Path, s.Sched, s.Main, s.Restarts)
}

// NodeState is what one poll of the node showed.
type NodeState struct {
	At                    time.Time
	Label                 string // contract.DRAModeLabel, "" when absent
	Capacity, Allocatable int64  // Resource
}

func (s NodeState) String() string {
	return fmt.Sprintf("label=%q capacity=%d allocatable=%d", s.Label, s.Capacity, s.Allocatable)
}

// EventSeen is an event about a watched pod, at the poll that first saw it
// (or saw its count grow); events reach the API in batches, seconds late.
type EventSeen struct {
	At                   time.Time
	Occurred             time.Time // the event's own eventTime (µs), zero for kubelet's older events
	Pod, Reason, Message string
	Count                int32
}

// SwitchObserver polls the node and a set of pods until Stop, keeping every
// change: what pods see while the node changes owner.
type SwitchObserver struct {
	d       *Deployer
	client  kubernetes.Interface
	ns, key string
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu       sync.Mutex
	pods     map[string][]PodState
	node     []NodeState
	events   []EventSeen
	counts   map[string]int32 // event UID -> count seen
	lastPoll time.Time
	maxGap   time.Duration
	lastErr  error
}

// ObserveSwitch starts polling, every interval, the node (label labelKey,
// capacity and allocatable of Resource) and the pods of namespace ns added by
// Watch, and their events every fifth interval. Stop ends it. It has its own
// API client: the shared one's client-go default of 5 requests/s would stretch
// the polls to seconds.
func (d *Deployer) ObserveSwitch(ctx context.Context, ns, labelKey string, interval time.Duration) (*SwitchObserver, error) {
	cfg := rest.CopyConfig(d.kube.Config)
	cfg.QPS, cfg.Burst = 200, 400
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client for %s: %w", cfg.Host, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	o := &SwitchObserver{d: d, client: client, ns: ns, key: labelKey, cancel: cancel,
		pods: map[string][]PodState{}, counts: map[string]int32{}}
	o.wg.Add(2)
	go o.every(ctx, interval, o.pollStates)
	go o.every(ctx, 5*interval, o.pollAllEvents)
	return o, nil
}

// Watch adds pod name to the polled pods.
func (o *SwitchObserver) Watch(name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.pods[name]; !ok {
		o.pods[name] = nil
	}
}

// Latest is pod name's last state (false before its first poll).
func (o *SwitchObserver) Latest(name string) (PodState, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	tl := o.pods[name]
	if len(tl) == 0 {
		return PodState{}, false
	}
	return tl[len(tl)-1], true
}

// SwitchTimeline is everything a SwitchObserver saw, each list in time order
// and holding only changes.
type SwitchTimeline struct {
	Node   []NodeState
	Pods   map[string][]PodState
	Events []EventSeen
	// MaxGap is the longest time between two node and pod polls: the
	// timeline's resolution (API reads slow down while the node switches).
	MaxGap time.Duration
	// LastErr is the last failed API read, if any (polling went on).
	LastErr error
}

// Stop ends the polling, waits for it and returns what it saw.
func (o *SwitchObserver) Stop() SwitchTimeline {
	o.cancel()
	o.wg.Wait()
	o.mu.Lock()
	defer o.mu.Unlock()
	return SwitchTimeline{Node: o.node, Pods: o.pods, Events: o.events, MaxGap: o.maxGap, LastErr: o.lastErr}
}

func (o *SwitchObserver) every(ctx context.Context, interval time.Duration, poll func(context.Context) error) {
	defer o.wg.Done()
	for {
		if err := poll(ctx); err != nil && ctx.Err() == nil {
			o.mu.Lock()
			o.lastErr = err
			o.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

func (o *SwitchObserver) watched() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	names := make([]string, 0, len(o.pods))
	for n := range o.pods {
		names = append(names, n)
	}
	return names
}

func (o *SwitchObserver) pollAllEvents(ctx context.Context) error {
	var errs []error
	for _, name := range o.watched() {
		errs = append(errs, o.pollEvents(ctx, name))
	}
	return errors.Join(errs...)
}

func (o *SwitchObserver) pollStates(ctx context.Context) error {
	start := time.Now()
	o.mu.Lock()
	if !o.lastPoll.IsZero() {
		o.maxGap = max(o.maxGap, start.Sub(o.lastPoll))
	}
	o.lastPoll = start
	o.mu.Unlock()
	names := o.watched()
	var errs []error
	n, err := o.client.CoreV1().Nodes().Get(ctx, o.d.node.Name(), metav1.GetOptions{})
	if err == nil {
		c, a := n.Status.Capacity[Resource], n.Status.Allocatable[Resource]
		o.addNode(NodeState{At: time.Now(), Label: n.Labels[o.key], Capacity: c.Value(), Allocatable: a.Value()})
	} else {
		errs = append(errs, err)
	}
	if len(names) > 0 {
		pods, err := o.client.CoreV1().Pods(o.ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			at := time.Now()
			for _, name := range names {
				i := slices.IndexFunc(pods.Items, func(p corev1.Pod) bool { return p.Name == name })
				if i < 0 {
					o.addPod(name, PodState{At: at, Gone: true})
					continue
				}
				o.addPod(name, podState(at, &pods.Items[i]))
			}
		} else {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (o *SwitchObserver) pollEvents(ctx context.Context, pod string) error {
	evs, err := o.client.CoreV1().Events(o.ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": pod}.String()})
	if err != nil {
		return err
	}
	at := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range evs.Items {
		count := e.Count
		if e.Series != nil {
			count = e.Series.Count
		}
		if seen, ok := o.counts[string(e.UID)]; ok && seen >= count {
			continue
		}
		o.counts[string(e.UID)] = count
		occurred := e.EventTime.Time
		if e.Series != nil && !e.Series.LastObservedTime.IsZero() {
			occurred = e.Series.LastObservedTime.Time
		}
		o.events = append(o.events, EventSeen{At: at, Occurred: occurred, Pod: pod, Reason: e.Reason, Message: e.Message, Count: count})
	}
	return nil
}

func (o *SwitchObserver) addNode(s NodeState) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if l := len(o.node); l == 0 || o.node[l-1].String() != s.String() {
		o.node = append(o.node, s)
	}
}

func (o *SwitchObserver) addPod(name string, s PodState) {
	o.mu.Lock()
	defer o.mu.Unlock()
	tl := o.pods[name]
	if l := len(tl); l == 0 || tl[l-1].String() != s.String() {
		o.pods[name] = append(tl, s)
	}
}

func podState(at time.Time, p *corev1.Pod) PodState {
	s := PodState{At: at, Phase: p.Status.Phase, Node: p.Spec.NodeName, Main: "none"}
	if p.Status.Reason != "" || p.Status.Message != "" {
		s.Reason = strings.TrimSpace(p.Status.Reason + ": " + p.Status.Message)
	}
	switch {
	case p.Status.ExtendedResourceClaimStatus != nil:
		s.Path = PathDRA
	case p.Spec.NodeName != "":
		s.Path = PathDevicePlugin
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			s.Sched = strings.TrimSpace(fmt.Sprintf("%s %s%s", c.Status, c.Reason, prefixed(": ", c.Message)))
		}
	}
	if len(p.Status.ContainerStatuses) > 0 {
		c := p.Status.ContainerStatuses[0]
		s.Restarts = c.RestartCount
		switch {
		case c.State.Running != nil:
			s.Main = "running"
		case c.State.Waiting != nil:
			s.Main = "waiting " + c.State.Waiting.Reason + prefixed(": ", c.State.Waiting.Message)
		case c.State.Terminated != nil:
			s.Main = "terminated " + c.State.Terminated.Reason + prefixed(": ", c.State.Terminated.Message)
		}
	}
	return s
}

func countText(n int32) string {
	if n < 2 {
		return ""
	}
	return strconv.Itoa(int(n))
}

func prefixed(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}

// Lines is the timeline merged in time order (events when seen), each line
// with its offset from t0.
func (tl SwitchTimeline) Lines(t0 time.Time) []string {
	type line struct {
		at   time.Time
		text string
	}
	var ls []line
	for _, s := range tl.Node {
		ls = append(ls, line{s.At, "node " + s.String()})
	}
	for name, states := range tl.Pods {
		for _, s := range states {
			ls = append(ls, line{s.At, "pod " + name + " " + s.String()})
		}
	}
	for _, e := range tl.Events {
		when := ""
		if !e.Occurred.IsZero() {
			when = fmt.Sprintf(" (event time %+.3fs)", e.Occurred.Sub(t0).Seconds())
		}
		ls = append(ls, line{e.At, fmt.Sprintf("event %s %s%s%s: %s", e.Pod, e.Reason, prefixed(" x", countText(e.Count)), when, e.Message)})
	}
	slices.SortStableFunc(ls, func(a, b line) int { return a.at.Compare(b.at) })
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = fmt.Sprintf("%+8.3fs %s", l.at.Sub(t0).Seconds(), l.text)
	}
	return out
}

// First is the first state of pod name that ok accepts, while polling or after Stop.
func (o *SwitchObserver) First(name string, ok func(PodState) bool) (PodState, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	i := slices.IndexFunc(o.pods[name], ok)
	if i < 0 {
		return PodState{}, false
	}
	return o.pods[name][i], true
}

// WaitLabel polls the node every 20 ms until the observed label has value
// (absent when value is "") and returns when it saw it.
func (o *SwitchObserver) WaitLabel(ctx context.Context, value string, timeout time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var at time.Time
	err := Poll(ctx, 20*time.Millisecond, func(ctx context.Context) error {
		n, err := o.client.CoreV1().Nodes().Get(ctx, o.d.node.Name(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := n.Labels[o.key]; got != value {
			return fmt.Errorf("node %s label %s=%q, want %q", o.d.node.Name(), o.key, got, value)
		}
		at = time.Now()
		return nil
	})
	return at, err
}
