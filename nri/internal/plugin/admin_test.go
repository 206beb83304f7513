package plugin_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/shared/contract"
)

// writeAdminSpec writes claim uid's own CDI device for a claim with admin
// access to uuid, as nvinject-dra does.
func writeAdminSpec(t *testing.T, dir, uid, uuid string) {
	t.Helper()
	spec := `{"cdiVersion":"0.6.0","kind":"nvidia.com/claim","devices":[{"name":"` + uid + `",` +
		`"annotations":{"` + contract.SharedClaimAnnotation + `":"` + uid + `","` + contract.SharedClaimUUIDsAnnotation + `":"` + uuid + `","` + contract.AdminAccessAnnotation + `":"true"},` +
		`"containerEdits":{"env":["` + contract.EnvSharedClaim + `=` + uid + `"]}}]}`
	if err := os.WriteFile(filepath.Join(dir, "nvidia.com-claim_"+uid+".json"), []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A monitor with admin access runs beside the pod holding the GPU, and its
// audit record says so; a second pod without admin access is still refused
// beside them.
func TestAdminAccessMonitor(t *testing.T) {
	k := &kubelet{}
	a := &auditor{}
	uuid1 := nritest.NewNode(t, "sim:a100-80gb*8", false).Devices[1].UUID
	e := start(t, envOpts{kubelet: serveKubelet(t, k), handlerOpts: []plugin.Option{plugin.WithAuditor(a)}, extraDir: func(dir string) {
		writeAdminSpec(t, dir, "uid-mon", uuid1)
	}})
	gpu1 := e.node.Name(1)
	mon := contract.SharedClaimDevice("nvidia.com", "uid-mon")
	var pods []*api.PodSandbox
	defer func() {
		for _, p := range pods {
			e.remove(t, p)
		}
	}()
	create := func(name, claim string, names ...string) error {
		k.claimAs("pod-"+name, "main", claim, names...)
		pod := nritest.Pod(name, "nvidia", nil)
		pods = append(pods, pod)
		_, _, err := e.create(t, pod, nil, names)
		return err
	}
	if err := create("work", "work", gpu1); err != nil {
		t.Fatal(err)
	}
	a.take()
	if err := create("mon", "monitor", gpu1, mon); err != nil {
		t.Fatalf("admin-access monitor refused beside the GPU's pod: %v", err)
	}
	recs := a.take()
	if len(recs) != 1 || !recs[0].Admin || !strings.Contains(recs[0].Note().Verdict, "with admin access beside [default/pod-work]") {
		t.Errorf("monitor's record %+v", recs)
	}
	before := refusals(t, e.reg, plugin.ReasonHeld)
	err := create("second", "second", gpu1)
	wantRefused(t, e, err, before, plugin.ReasonHeld, uuid1, "pod default/pod-work", "a GPU serves one pod")
}
