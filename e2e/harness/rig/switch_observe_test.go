package rig

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestPodState(t *testing.T) {
	at := time.Now()
	pending := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}}}}
	dra := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
		ExtendedResourceClaimStatus: &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: "c"},
		ContainerStatuses:           []corev1.ContainerStatus{{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, RestartCount: 2}}}}
	refused := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{Phase: corev1.PodFailed,
		Reason: "UnexpectedAdmissionError", Message: "Allocate failed"}}
	creating := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{Phase: corev1.PodPending,
		ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}}}
	tests := []struct {
		pod     *corev1.Pod
		path    string
		running bool
		says    string
	}{
		{pending, "", false, `scheduled="False Unschedulable: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu."`},
		{dra, PathDRA, true, `container="running" restarts=2`},
		{refused, PathDevicePlugin, false, `phase=Failed reason=UnexpectedAdmissionError: Allocate failed`},
		{creating, PathDevicePlugin, false, `container="waiting ContainerCreating"`},
	}
	for _, tt := range tests {
		s := podState(at, tt.pod)
		if s.Path != tt.path || s.Running() != tt.running || !strings.Contains(s.String(), tt.says) {
			t.Errorf("podState = path %q running %v %s; want path %q running %v, containing %s", s.Path, s.Running(), s, tt.path, tt.running, tt.says)
		}
	}
}

func TestSwitchTimelineLines(t *testing.T) {
	t0 := time.Now()
	tl := SwitchTimeline{
		Node: []NodeState{{At: t0.Add(-100 * time.Millisecond), Capacity: 1, Allocatable: 1}, {At: t0.Add(2 * time.Second), Label: "dra", Capacity: 1}},
		Pods: map[string][]PodState{"p": {{At: t0.Add(time.Second), Phase: corev1.PodPending}, {At: t0.Add(3 * time.Second), Gone: true}}},
		Events: []EventSeen{{At: t0.Add(2500 * time.Millisecond), Occurred: t0.Add(1500 * time.Millisecond), Pod: "p",
			Reason: "FailedScheduling", Message: "0/1 nodes", Count: 3}},
	}
	got := tl.Lines(t0)
	want := []string{
		`  -0.100s node label="" capacity=1 allocatable=1`,
		`  +1.000s pod p phase=Pending node="" path="" scheduled="" container="" restarts=0`,
		`  +2.000s node label="dra" capacity=1 allocatable=0`,
		`  +2.500s event p FailedScheduling x3 (event time +1.500s): 0/1 nodes`,
		`  +3.000s pod p gone`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Lines =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
