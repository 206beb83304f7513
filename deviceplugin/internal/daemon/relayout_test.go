package daemon

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// A MIG layout changed on the running node reaches kubelet without a
// restart: the new profile registers its resource with the new devices,
// the profile that is gone leaves (its socket removed), and the whole GPU
// is published again.
func TestMIGLayoutChangeReachesKubeletWithoutARestart(t *testing.T) {
	const node = "sim:a100-80gb*2,mig=1:3g.40gb+2g.20gb"
	r := startExpecting(t, map[string]string{
		"nvidia.com/gpu":         "nvinject-gpu.sock",
		"nvidia.com/mig-3g.40gb": "nvinject-gpu-mig-3g.40gb.sock",
		"nvidia.com/mig-2g.20gb": "nvinject-gpu-mig-2g.20gb.sock",
	}, node, "--mig-strategy=mixed", "--visible-devices=all", "--mig-rescan-interval=10ms")
	r.kubelet.WaitConnected(t, "nvinject-gpu-mig-2g.20gb.sock", 10*time.Second)
	twoG := -1
	for _, d := range watchClient(t, r.clients["nvidia.com/mig-2g.20gb"])() {
		for gi := range 8 {
			if sim.MIGUUID(simUUID(1), gi, 0) == d.ID {
				twoG = gi
			}
		}
	}
	if err := r.sim.DestroyGPUInstance(1, twoG); err != nil {
		t.Fatalf("destroy the 2g.20gb (GI %d): %v", twoG, err)
	}
	for range 2 {
		if _, _, err := r.sim.CreateGPUInstance(1, "1g.10gb"); err != nil {
			t.Fatal(err)
		}
	}

	const small = "nvinject-gpu-mig-1g.10gb.sock"
	deadline := time.Now().Add(10 * time.Second)
	for len(r.kubelet.Devices(small)) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("kubelet never saw two 1g.10gb devices at %s (accepted %v)", small, r.kubelet.Accepted())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, d := range r.kubelet.Devices(small) {
		if d.Health != pluginapi.Healthy {
			t.Errorf("1g.10gb device %v: want Healthy", d)
		}
	}
	gone := filepath.Join(r.dir, "nvinject-gpu-mig-2g.20gb.sock")
	for _, err := os.Stat(gone); err == nil; _, err = os.Stat(gone) {
		if time.Now().After(deadline) {
			t.Fatalf("the socket of the profile that left, %s, is still there", gone)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for !r.kubelet.Connected("nvinject-gpu-mig-3g.40gb.sock") || len(r.kubelet.Devices("nvinject-gpu-mig-3g.40gb.sock")) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the 3g.40gb the change left alone is not published again")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-r.done:
		t.Fatalf("the daemon ended (%v); a layout change must not restart it", err)
	default:
	}
}
