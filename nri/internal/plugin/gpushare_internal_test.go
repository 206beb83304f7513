package plugin

import (
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/shared/contract"
)

// A share's container as it will run: its share's MPS variables and pipe
// mount pass; a variable another plugin or the pod changed, a missing pipe
// mount, a second share, or another daemon's pipe is refused.
func TestCheckShare(t *testing.T) {
	h := &Handler{vendor: "nvidia.com"}
	shareDev := func(uid, share string) resolve.Device {
		pipe := "/run/nvinject/mps/" + uid + "/pipe"
		return resolve.Device{Name: contract.SharedClaimDevice("nvidia.com", uid),
			Annotations: map[string]string{contract.SharedClaimAnnotation: uid, contract.GPUShareAnnotation: share},
			Edits: specs.ContainerEdits{Env: []string{"CUDA_MPS_PIPE_DIRECTORY=" + pipe, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M"},
				Mounts: []*specs.Mount{{HostPath: pipe, ContainerPath: pipe}}}}
	}
	env := []string{"PATH=/bin", "CUDA_MPS_PIPE_DIRECTORY=/run/nvinject/mps/u1/pipe", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M"}
	own := &api.Mount{Source: "/run/nvinject/mps/u1/pipe", Destination: "/run/nvinject/mps/u1/pipe"}
	shm := &api.Mount{Source: "/run/nvinject/mps/shm", Destination: "/dev/shm"}
	for _, tc := range []struct {
		name   string
		devs   []resolve.Device
		env    []string
		mounts []*api.Mount
		want   string
	}{
		{name: "its share", devs: []resolve.Device{shareDev("u1", "s1")}, env: env, mounts: []*api.Mount{own, shm}},
		{name: "no share", env: []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"}},
		{name: "limit raised", devs: []resolve.Device{shareDev("u1", "s1")}, env: append(env[:len(env):len(env)], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"), mounts: []*api.Mount{own},
			want: `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is "100" in the container, not its GPU share's "50"`},
		{name: "limit unset", devs: []resolve.Device{shareDev("u1", "s1")}, env: env[:2], mounts: []*api.Mount{own}, want: "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is \"\""},
		{name: "pipe not mounted", devs: []resolve.Device{shareDev("u1", "s1")}, env: env, mounts: []*api.Mount{shm}, want: "is not mounted"},
		{name: "another daemon", devs: []resolve.Device{shareDev("u1", "s1")}, env: env, mounts: []*api.Mount{own, {Source: "/run/nvinject/mps/u2/pipe", Destination: "/x"}}, want: "another MPS daemon's pipe directory"},
		{name: "two shares", devs: []resolve.Device{shareDev("u1", "s1"), shareDev("u2", "s2")}, env: env, mounts: []*api.Mount{own}, want: "one container holds one share"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &request{who: "container main of pod default/p", res: resolve.Result{Devices: tc.devs}}
			err := h.checkShare(r, final{env: tc.env, mounts: tc.mounts})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if re, ok := err.(*RefusalError); !ok || re.Reason != ReasonGPUShare {
				t.Errorf("reason %v, want %s", err, ReasonGPUShare)
			}
		})
	}
}
