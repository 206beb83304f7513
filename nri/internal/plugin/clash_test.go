package plugin

import (
	"strings"
	"testing"

	"github.com/nvinject/nvinject/nri/internal/ledger"
)

// A refusal says what of mine is held, by whom and what to do, for a GPU,
// a MIG device and a time-sliced GPU whose replicas are all in use. (Which
// units clash is the ledger's: nri/internal/ledger.)
func TestHeldError(t *testing.T) {
	whole := ledger.Unit{UUID: "GPU-p"}
	migA, migB := ledger.Unit{UUID: "MIG-a", Parent: "GPU-p"}, ledger.Unit{UUID: "MIG-b", Parent: "GPU-p"}
	shared := ledger.Unit{UUID: "GPU-s", Replicas: 2}
	h := &Handler{}
	for _, tc := range []struct {
		mine, theirs ledger.Unit
		want         string
	}{
		{migA, migA, "MIG device MIG-a is held by container main of pod default/x via y; a GPU serves one pod"},
		{migA, whole, "MIG device MIG-a is on GPU GPU-p, which is held by"},
		{whole, migB, "GPU GPU-p has MIG device MIG-b, which is held by"},
		{shared, shared, "GPU GPU-s is shared by time-slicing with 2 replicas, and all are in use by container main of pod default/x"},
		{ledger.Unit{UUID: "GPU-p", Share: true, Claim: "c1"}, whole, "GPU GPU-p is held whole by"},
		{ledger.Unit{UUID: "GPU-p", Claim: "c1"}, whole, "GPU GPU-p is held by container main of pod default/x via y, not through shared claim c1"},
	} {
		if err := h.heldError(tc.mine, tc.theirs, "container main of pod default/x", "via y"); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("heldError(%+v, %+v) = %v, want it to start %q", tc.mine, tc.theirs, err, tc.want)
		}
	}
}
