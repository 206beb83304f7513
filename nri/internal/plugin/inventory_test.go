package plugin_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/contract"
)

// A MIG device created after the inventory was read (a layout changed at
// runtime) is admitted once the inventory is read again; a device the
// node still does not have is refused, and a stream of them reads the
// inventory at most once a second.
func TestInventoryReadAgainAfterALayoutChange(t *testing.T) {
	const node = "sim:a100-80gb*2,mig=1:3g.40gb+1g.10gb*2"
	n := nritest.NewNode(t, node, false)
	fresh := verify.InventoryOf(n.Node)
	newMIG := n.Devices[1].MIG[2]
	stale := verify.InventoryOf(n.Node)
	delete(stale.MIG, newMIG.UUID)
	for _, tc := range []struct {
		name      string
		reread    *verify.Inventory
		admitted  bool
		wantReads int64
	}{
		{"the new device is there now", fresh, true, 1},
		{"still not there", stale, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reads atomic.Int64
			refresh := plugin.WithInventoryRefresh(func(context.Context) (*verify.Inventory, error) {
				reads.Add(1)
				return tc.reread, nil
			})
			e := start(t, envOpts{node: node, handlerOpts: []plugin.Option{plugin.WithInventory(stale), refresh}})
			for i, id := range []string{"a", "b"} {
				if i == 1 && tc.admitted {
					break
				}
				pod := nritest.Pod(id, "nvidia", nil)
				s := nritest.BaseSpec()
				ctr := nritest.Container("ctr-"+id, id, "main", s, map[string]string{contract.DevicesAnnotation: "nvidia.com/gpu=" + newMIG.UUID})
				before := refusals(t, e.reg, string(verify.ReasonStaleSpec))
				_, err := e.rt.Create(context.Background(), pod, ctr)
				if tc.admitted && err != nil {
					t.Fatalf("the layout's new MIG device refused: %v", err)
				}
				if !tc.admitted {
					wantRefused(t, e, err, before, string(verify.ReasonStaleSpec), newMIG.UUID)
				}
			}
			if got := reads.Load(); got != tc.wantReads {
				t.Errorf("inventory read again %d times, want %d", got, tc.wantReads)
			}
		})
	}
}
