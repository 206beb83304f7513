package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/shared/contract"
)

// TestAllocateHonoursTheContract feeds the device plugin's real Allocate
// response (over its gRPC socket, as kubelet calls it) into the decoder the
// NRI plugin uses, for every strategy and both ID strategies, and resolves
// the decoded names against the spec the plugin wrote: each container gets
// exactly the GPUs kubelet asked for, by UUID.
func TestAllocateHonoursTheContract(t *testing.T) {
	strategies := [][]contract.Strategy{
		{contract.StrategyAnnotations}, {contract.StrategyCRI}, {contract.StrategyNRI},
		contract.DefaultStrategies(), contract.AllStrategies(),
	}
	for _, idStrategy := range []string{"uuid", "index"} {
		for _, ss := range strategies {
			names := make([]string, len(ss))
			for i, s := range ss {
				names[i] = string(s)
			}
			t.Run(idStrategy+"/"+strings.Join(names, ","), func(t *testing.T) {
				r := start(t, "sim:a100-80gb*8", "--device-id-strategy="+idStrategy, "--device-list-strategy="+strings.Join(names, ","))
				ids := []string{simUUID(2), simUUID(5)}
				if idStrategy == "index" {
					ids = []string{"2", "5"}
				}
				next := r.watch(t)
				for h := healthOf(next()); h[ids[0]] != pluginapi.Healthy || h[ids[1]] != pluginapi.Healthy; h = healthOf(next()) {
				}
				resp, err := r.client.Allocate(context.Background(), &pluginapi.AllocateRequest{
					ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}},
				})
				if err != nil {
					t.Fatal(err)
				}
				cr := resp.ContainerResponses[0]
				a := contract.Allocation{Annotations: cr.Annotations}
				for _, d := range cr.CdiDevices {
					a.CDIDevices = append(a.CDIDevices, d.Name)
				}
				dec, err := contract.NewDecoder(r.cfg.AnnotationPrefix)
				if err != nil {
					t.Fatal(err)
				}
				got, err := dec.Decode(a)
				if err != nil {
					t.Fatalf("the NRI side cannot decode %+v: %v", a, err)
				}
				uuids := resolveUUIDs(t, filepath.Join(r.dir, "cdi"), got)
				if want := []string{simUUID(2), simUUID(5)}; !slices.Equal(uuids, want) {
					t.Fatalf("allocation %+v resolves to GPUs %v, want %v", a, uuids, want)
				}
			})
		}
	}
}

// resolveUUIDs injects names with the CDI library from specDir and reads back
// the GPU UUIDs the spec's env names, in minor order.
func resolveUUIDs(t *testing.T, specDir string, names []string) []string {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &specs.Spec{Process: &specs.Process{}}
	if unresolved, err := cache.InjectDevices(spec, names...); err != nil {
		t.Fatalf("names %v do not resolve in %s (unresolved %v): %v", names, specDir, unresolved, err)
	}
	var uuids []string
	for minor := range 8 {
		prefix := fmt.Sprintf("%s%d=", contract.EnvUUIDPrefix, minor)
		for _, e := range spec.Process.Env {
			if strings.HasPrefix(e, prefix) {
				uuids = append(uuids, strings.TrimPrefix(e, prefix))
			}
		}
	}
	return uuids
}
