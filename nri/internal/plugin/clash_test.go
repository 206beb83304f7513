package plugin

import (
	"strings"
	"testing"
)

// A whole GPU and its MIG devices hold each other off, across pods; the
// MIG devices of one GPU do not, nor do a pod's own containers.
func TestHoldersClash(t *testing.T) {
	whole := unit{uuid: "GPU-p"}
	migA, migB := unit{uuid: "MIG-a", parent: "GPU-p"}, unit{uuid: "MIG-b", parent: "GPU-p"}
	other := unit{uuid: "MIG-c", parent: "GPU-q"}
	pod := func(uid string, units ...unit) holder {
		return holder{podUID: uid, pod: "default/" + uid, ctr: "main", units: units}
	}
	for _, tc := range []struct {
		name         string
		held, asked  holder
		busy         bool
		mine, theirs unit
	}{
		{name: "same MIG device", held: pod("1", migA), asked: pod("2", migA), busy: true, mine: migA, theirs: migA},
		{name: "MIG device of a GPU held whole", held: pod("1", whole), asked: pod("2", migA), busy: true, mine: migA, theirs: whole},
		{name: "GPU whole with a MIG device held", held: pod("1", migB), asked: pod("2", other, whole), busy: true, mine: whole, theirs: migB},
		{name: "two MIG devices of one GPU", held: pod("1", migA), asked: pod("2", migB)},
		{name: "the same pod", held: pod("1", whole), asked: pod("1", migA)},
		{name: "another GPU's MIG device", held: pod("1", whole), asked: pod("2", other)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r holders
			r.admit("held", tc.held)
			_, mine, theirs, busy := r.admit("asked", tc.asked)
			if busy != tc.busy || mine != tc.mine || theirs != tc.theirs {
				t.Errorf("admit = %v %+v %+v, want %v %+v %+v", busy, mine, theirs, tc.busy, tc.mine, tc.theirs)
			}
		})
	}
	h := &Handler{}
	for _, tc := range []struct {
		mine, theirs unit
		want         string
	}{
		{migA, migA, "MIG device MIG-a is held by"},
		{migA, whole, "MIG device MIG-a is on GPU GPU-p, which is held by"},
		{whole, migB, "GPU GPU-p has MIG device MIG-b, which is held by"},
	} {
		if err := h.heldError(tc.mine, tc.theirs, "container main of pod default/x", "via y"); err == nil || err.Error()[:len(tc.want)] != tc.want {
			t.Errorf("heldError(%+v, %+v) = %v, want it to start %q", tc.mine, tc.theirs, err, tc.want)
		}
	}
}

// A time-sliced GPU serves up to its replicas' pods, no more; a pod's own
// containers count once; a whole GPU still holds off its MIG devices.
func TestHoldersShare(t *testing.T) {
	shared := unit{uuid: "GPU-s", replicas: 2}
	pod := func(uid, ctr string, units ...unit) holder {
		return holder{podUID: uid, pod: "default/" + uid, ctr: ctr, units: units}
	}
	var r holders
	for i, tc := range []struct {
		id   string
		h    holder
		busy bool
	}{
		{"a1", pod("a", "main", shared), false},
		{"a2", pod("a", "side", shared), false},
		{"b1", pod("b", "main", shared), false},
		{"c1", pod("c", "main", shared), true},
	} {
		o, mine, _, busy := r.admit(tc.id, tc.h)
		if busy != tc.busy {
			t.Fatalf("step %d (%s): busy %v, want %v", i, tc.id, busy, tc.busy)
		}
		if busy && (o.pod != "default/a, default/b" || o.ctr != "" || mine != shared) {
			t.Errorf("refusal names %+v %+v, want both holding pods", o, mine)
		}
	}
	r.releasePod(pod("a", ""))
	if _, _, _, busy := r.admit("c1", pod("c", "main", shared)); busy {
		t.Error("a replica freed by pod a's end, but pod c is still refused")
	}
	h := &Handler{}
	if err := h.heldError(shared, shared, "pods default/a, default/b", "as running containers"); err == nil || !strings.Contains(err.Error(), "2 replicas, and all are in use by pods default/a, default/b") {
		t.Errorf("shared refusal: %v", err)
	}
}
