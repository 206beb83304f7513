package ledger

import (
	"fmt"
	"reflect"
	"testing"
)

var (
	whole      = Unit{UUID: "GPU-p"}
	migA, migB = Unit{UUID: "MIG-a", Parent: "GPU-p"}, Unit{UUID: "MIG-b", Parent: "GPU-p"}
	other      = Unit{UUID: "MIG-c", Parent: "GPU-q"}
)

func pod(uid, ctr string, units ...Unit) Holder {
	return Holder{PodUID: uid, Pod: "default/" + uid, Ctr: ctr, Units: units}
}

// Which two units cannot serve two pods.
func TestClashes(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b Unit
		want bool
	}{
		{"one GPU", whole, whole, true},
		{"one MIG device", migA, migA, true},
		{"a GPU and its MIG device", whole, migA, true},
		{"a MIG device and its GPU", migA, whole, true},
		{"two MIG devices of one GPU", migA, migB, false},
		{"another GPU's MIG device", whole, other, false},
		{"a time-sliced GPU", Unit{UUID: "GPU-s", Replicas: 2}, Unit{UUID: "GPU-s", Replicas: 2}, false},
		{"one shared claim", Unit{UUID: "GPU-p", Claim: "c1"}, Unit{UUID: "GPU-p", Claim: "c1"}, false},
		{"two shared claims", Unit{UUID: "GPU-p", Claim: "c1"}, Unit{UUID: "GPU-p", Claim: "c2"}, true},
		{"two GPU shares", Unit{UUID: "GPU-p", Share: true, Claim: "c1"}, Unit{UUID: "GPU-p", Share: true, Claim: "c2"}, false},
		{"a share beside the GPU whole", Unit{UUID: "GPU-p", Share: true, Claim: "c1"}, whole, true},
		{"a monitor with admin access", Unit{UUID: "GPU-p", Admin: true}, whole, false},
		{"a monitor's GPU and a MIG device on it", migA, Unit{UUID: "GPU-p", Admin: true}, false},
	} {
		if got := tc.a.Clashes(tc.b); got != tc.want {
			t.Errorf("%s: %+v.Clashes(%+v) = %v, want %v", tc.name, tc.a, tc.b, got, tc.want)
		}
	}
}

// Admit refuses a clash with another pod's container, names it and the
// two units, and records nothing then; a pod's own containers never clash.
func TestAdmit(t *testing.T) {
	for _, tc := range []struct {
		name         string
		held, asked  Holder
		ok           bool
		mine, theirs Unit
	}{
		{name: "same MIG device", held: pod("1", "main", migA), asked: pod("2", "main", migA), mine: migA, theirs: migA},
		{name: "MIG device of a GPU held whole", held: pod("1", "main", whole), asked: pod("2", "main", migA), mine: migA, theirs: whole},
		{name: "GPU whole with a MIG device held", held: pod("1", "main", migB), asked: pod("2", "main", other, whole), mine: whole, theirs: migB},
		{name: "two MIG devices of one GPU", held: pod("1", "main", migA), asked: pod("2", "main", migB), ok: true},
		{name: "the same pod", held: pod("1", "main", whole), asked: pod("1", "side", migA), ok: true},
		{name: "another GPU's MIG device", held: pod("1", "main", whole), asked: pod("2", "main", other), ok: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l Ledger
			if _, ok := l.Admit("held", tc.held); !ok {
				t.Fatal("the first holder refused")
			}
			c, ok := l.Admit("asked", tc.asked)
			if ok != tc.ok || c.Mine != tc.mine || c.Theirs != tc.theirs {
				t.Errorf("Admit = %v %+v, want %v %+v %+v", ok, c, tc.ok, tc.mine, tc.theirs)
			}
			if !ok && !reflect.DeepEqual(c.Holder, tc.held) {
				t.Errorf("refusal names %+v, want the holder %+v", c.Holder, tc.held)
			}
			l.Release("held")
			if _, ok := l.Admit("asked", tc.asked); !ok {
				t.Error("refused again after the holder was released")
			}
		})
	}
}

// A time-sliced GPU serves up to its replicas' pods, no more; a pod's own
// containers count once; a replica comes back when its pod ends.
func TestAdmitShared(t *testing.T) {
	shared := Unit{UUID: "GPU-s", Replicas: 2}
	var l Ledger
	for i, tc := range []struct {
		id string
		h  Holder
		ok bool
	}{
		{"a1", pod("a", "main", shared), true},
		{"a2", pod("a", "side", shared), true},
		{"b1", pod("b", "main", shared), true},
		{"c1", pod("c", "main", shared), false},
	} {
		c, ok := l.Admit(tc.id, tc.h)
		if ok != tc.ok {
			t.Fatalf("step %d (%s): admitted %v, want %v", i, tc.id, ok, tc.ok)
		}
		if !ok && (c.Holder.Pod != "default/a, default/b" || c.Holder.Ctr != "" || c.Mine != shared) {
			t.Errorf("refusal names %+v, want both holding pods", c)
		}
	}
	l.ReleasePod(pod("a", ""))
	if _, ok := l.Admit("c1", pod("c", "main", shared)); !ok {
		t.Error("a replica freed by pod a's end, but pod c is still refused")
	}
}

// Of several holders, a refusal names the same one every time: the first
// in container ID order, not a map's.
func TestAdmitNamesOneHolder(t *testing.T) {
	shared := Unit{UUID: "GPU-p", Claim: "c1"}
	for i := range 50 {
		var l Ledger
		for _, id := range []string{"c-b", "c-a", "c-c"} {
			if _, ok := l.Admit(id, pod(id, "main", shared)); !ok {
				t.Fatalf("claim holder %s refused", id)
			}
		}
		c, ok := l.Admit("c-z", pod("z", "main", whole))
		if ok || c.Holder.PodUID != "c-a" {
			t.Fatalf("try %d: refusal names %+v, want c-a's container", i, c.Holder)
		}
	}
}

// A monitor with admin access is admitted beside the pods that hold its
// GPU (or a MIG device on it) and names them; other pods' GPUs are not its.
func TestBeside(t *testing.T) {
	var l Ledger
	l.Admit("w1", pod("work", "main", whole))
	l.Admit("w2", pod("small", "main", Unit{UUID: "MIG-x", Parent: "GPU-q"}))
	l.Admit("o1", pod("elsewhere", "main", Unit{UUID: "GPU-r"}))
	mon := pod("monitor", "main", Unit{UUID: "GPU-p", Admin: true}, Unit{UUID: "GPU-q", Admin: true})
	if _, ok := l.Admit("m1", mon); !ok {
		t.Fatal("monitor with admin access refused")
	}
	if got := l.Beside(mon); !reflect.DeepEqual(got, []string{"default/small", "default/work"}) {
		t.Errorf("Beside = %v, want the pods on GPU-p and GPU-q", got)
	}
	l.Reset(map[string]Holder{"m1": mon})
	if got := l.Beside(mon); got != nil {
		t.Errorf("after Reset to the monitor alone, Beside = %v", got)
	}
}

// Two pods asking for one GPU at once: exactly one gets it.
func TestAdmitRace(t *testing.T) {
	var l Ledger
	got := make(chan bool, 16)
	for i := range 16 {
		go func() {
			_, ok := l.Admit(fmt.Sprint("c", i), pod(fmt.Sprint("p", i), "main", whole))
			got <- ok
		}()
	}
	admitted := 0
	for range 16 {
		if <-got {
			admitted++
		}
	}
	if admitted != 1 {
		t.Errorf("%d pods admitted on one GPU, want 1", admitted)
	}
}
