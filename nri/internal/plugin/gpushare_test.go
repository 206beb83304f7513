package plugin_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/shared/contract"
)

// writeShareSpec writes claim uid's own CDI device for a GPU share of uuid,
// as nvinject-dra does: the share ID annotation, the share's MPS daemon's
// pipe dir and its limits.
func writeShareSpec(t *testing.T, dir, uid, share, uuid string) {
	t.Helper()
	pipe := "/run/nvinject/mps/" + uid + "/pipe"
	spec := `{"cdiVersion":"0.6.0","kind":"nvidia.com/claim","devices":[{"name":"` + uid + `",` +
		`"annotations":{"` + contract.SharedClaimAnnotation + `":"` + uid + `","` + contract.SharedClaimUUIDsAnnotation + `":"` + uuid + `","` + contract.GPUShareAnnotation + `":"` + share + `"},` +
		`"containerEdits":{"env":["` + contract.EnvSharedClaim + `=` + uid + `","CUDA_MPS_PIPE_DIRECTORY=` + pipe + `","CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50","CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M"],` +
		`"mounts":[{"hostPath":"` + pipe + `","containerPath":"` + pipe + `","options":["rbind","rw"]}]}}]}`
	if err := os.WriteFile(filepath.Join(dir, "nvidia.com-claim_"+uid+".json"), []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Pods of different GPU shares run on one GPU; a pod holding the GPU whole
// is refused beside them, and a share beside a whole holder; a share's
// container that mounts another share's daemon is refused (TestCheckShare:
// the final environment).
func TestGPUShares(t *testing.T) {
	k := &kubelet{}
	uuid1 := nritest.NewNode(t, "sim:a100-80gb*8", false).Devices[1].UUID
	e := start(t, envOpts{kubelet: serveKubelet(t, k), extraDir: func(dir string) {
		writeShareSpec(t, dir, "uid-sa", "share-a", uuid1)
		writeShareSpec(t, dir, "uid-sb", "share-b", uuid1)
		writeShareSpec(t, dir, "uid-sc", "share-c", uuid1)
	}})
	gpu1 := e.node.Name(1)
	sa, sb, sc := contract.SharedClaimDevice("nvidia.com", "uid-sa"), contract.SharedClaimDevice("nvidia.com", "uid-sb"), contract.SharedClaimDevice("nvidia.com", "uid-sc")
	var pods []*api.PodSandbox
	create := func(name, claim string, names []string, mutate func(*oci.Spec)) error {
		t.Helper()
		k.claimAs("pod-"+name, "main", claim, names...)
		pod := nritest.Pod(name, "nvidia", nil)
		pods = append(pods, pod)
		s := nritest.BaseSpec()
		nritest.ContainerdCDI(t, s, e.node.SpecDir, names...)
		if mutate != nil {
			mutate(s)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := e.rt.Create(ctx, pod, nritest.Container("ctr-"+name, name, "main", s, nil))
		return err
	}
	clear := func() {
		for _, p := range pods {
			e.remove(t, p)
		}
		pods = nil
		k.reset()
	}

	if err := create("a", "share-a", []string{gpu1, sa}, nil); err != nil {
		t.Fatalf("first share refused: %v", err)
	}
	if err := create("b", "share-b", []string{gpu1, sb}, nil); err != nil {
		t.Fatalf("second share on the same GPU refused: %v", err)
	}
	before := refusals(t, e.reg, plugin.ReasonGPUShare)
	err := create("mnt", "share-c", []string{gpu1, sc}, func(s *oci.Spec) {
		s.Mounts = append(s.Mounts, oci.Mount{Source: "/run/nvinject/mps/uid-sa/pipe", Destination: "/peek", Type: "bind", Options: []string{"rbind"}})
	})
	wantRefused(t, e, err, before, plugin.ReasonGPUShare, "/run/nvinject/mps/uid-sa/pipe", "another MPS daemon's pipe directory")
	before = refusals(t, e.reg, plugin.ReasonHeld)
	err = create("w", "whole", []string{gpu1}, nil)
	wantRefused(t, e, err, before, plugin.ReasonHeld, uuid1, "held in shares", "whole or in shares, never both")

	clear()
	if err := create("w2", "whole", []string{gpu1}, nil); err != nil {
		t.Fatalf("whole GPU refused: %v", err)
	}
	before = refusals(t, e.reg, plugin.ReasonHeld)
	err = create("a2", "share-a", []string{gpu1, sa}, nil)
	wantRefused(t, e, err, before, plugin.ReasonHeld, uuid1, "held whole", "never both")
	clear()
}
