package injbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nvinject/nvinject/shared/contract"
)

// cgroupParent holds every benchmark pod's cgroup, so teardown can prove
// none is left.
const cgroupParent = "nvinject-injbench"

// criClient talks to containerd's CRI service over its unix socket, as
// kubelet does.
type criClient struct {
	conn *grpc.ClientConn
	rt   cri.RuntimeServiceClient
}

func dialCRI(socket string) (*criClient, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("CRI client for %s: %w", socket, err)
	}
	return &criClient{conn: conn, rt: cri.NewRuntimeServiceClient(conn)}, nil
}

func (c *criClient) close() error { return c.conn.Close() }

// version is containerd's name and version, also the readiness probe.
func (c *criClient) version(ctx context.Context) (string, error) {
	v, err := c.rt.Version(ctx, &cri.VersionRequest{})
	if err != nil {
		return "", fmt.Errorf("CRI Version: %w", err)
	}
	return v.GetRuntimeName() + " " + v.GetRuntimeVersion(), nil
}

// pod is one host-network pod sandbox.
type pod struct {
	id     string
	config *cri.PodSandboxConfig
}

func (c *criClient) runPod(ctx context.Context, name, handler string) (pod, error) {
	cfg := &cri.PodSandboxConfig{
		Metadata: &cri.PodSandboxMetadata{Name: name, Uid: name, Namespace: "injbench"},
		Linux: &cri.LinuxPodSandboxConfig{
			CgroupParent: "/" + cgroupParent + "/" + name,
			SecurityContext: &cri.LinuxSandboxSecurityContext{
				NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_NODE},
			},
		},
	}
	resp, err := c.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		return pod{}, fmt.Errorf("RunPodSandbox %s (handler %s): %w", name, handler, err)
	}
	return pod{id: resp.GetPodSandboxId(), config: cfg}, nil
}

// createAndStart creates the container and starts it: the span measured.
func (c *criClient) createAndStart(ctx context.Context, p pod, cfg *cri.ContainerConfig) (string, error) {
	resp, err := c.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: p.id, Config: cfg, SandboxConfig: p.config})
	if err != nil {
		return "", fmt.Errorf("CreateContainer in pod %s: %w", p.config.GetMetadata().GetName(), err)
	}
	id := resp.GetContainerId()
	if _, err := c.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: id}); err != nil {
		return id, fmt.Errorf("StartContainer %s: %w", id, err)
	}
	return id, nil
}

// runtimeSpec is the OCI spec containerd generated for the container, from
// the verbose ContainerStatus (what `crictl inspect` shows).
func (c *criClient) runtimeSpec(ctx context.Context, id string) (*oci.Spec, error) {
	resp, err := c.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return nil, fmt.Errorf("ContainerStatus %s: %w", id, err)
	}
	if st := resp.GetStatus().GetState(); st != cri.ContainerState_CONTAINER_RUNNING {
		return nil, fmt.Errorf("container %s is %s, not running", id, st)
	}
	var info struct {
		RuntimeSpec *oci.Spec `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(resp.GetInfo()["info"]), &info); err != nil || info.RuntimeSpec == nil {
		return nil, fmt.Errorf("container %s: verbose status has no runtime spec (%v)", id, err)
	}
	return info.RuntimeSpec, nil
}

// exec runs cmd in the container and fails unless it exits 0.
func (c *criClient) exec(ctx context.Context, id string, cmd ...string) (string, error) {
	resp, err := c.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 10})
	if err != nil {
		return "", fmt.Errorf("exec %v in %s: %w", cmd, id, err)
	}
	if resp.GetExitCode() != 0 {
		return "", fmt.Errorf("exec %v in %s exited %d: %s", cmd, id, resp.GetExitCode(), strings.TrimSpace(string(resp.GetStderr())))
	}
	return string(resp.GetStdout()), nil
}

// removePod stops and removes the pod with its containers.
func (c *criClient) removePod(ctx context.Context, id string) error {
	if _, err := c.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("StopPodSandbox %s: %w", id, err)
	}
	if _, err := c.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("RemovePodSandbox %s: %w", id, err)
	}
	return nil
}

// removeAllPods removes whatever pods remain (after a failed iteration).
func (c *criClient) removeAllPods(ctx context.Context) error {
	resp, err := c.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("ListPodSandbox: %w", err)
	}
	var errs []error
	for _, p := range resp.GetItems() {
		errs = append(errs, c.removePod(ctx, p.GetId()))
	}
	return errors.Join(errs...)
}

// gpuCheck is what a container must show to count as having the GPU.
type gpuCheck struct {
	uuid string
	// byPlugin: nvinject-nri recorded the UUID on the container; false
	// means the plugin must not have touched it.
	byPlugin bool
}

// gpuNode is the simulated GPU's device node as the CDI spec states it.
var gpuNode = oci.LinuxDevice{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0}

// check inspects the generated spec.
func (g gpuCheck) check(spec *oci.Spec) error {
	var devs []oci.LinuxDevice
	if spec.Linux != nil {
		devs = spec.Linux.Devices
	}
	if !slices.ContainsFunc(devs, func(d oci.LinuxDevice) bool {
		return d.Path == gpuNode.Path && d.Type == gpuNode.Type && d.Major == gpuNode.Major && d.Minor == gpuNode.Minor
	}) {
		return fmt.Errorf("runtime spec lacks device %s (c %d:%d)", gpuNode.Path, gpuNode.Major, gpuNode.Minor)
	}
	var env []string
	if spec.Process != nil {
		env = spec.Process.Env
	}
	if want := contract.EnvUUIDPrefix + "0=" + g.uuid; !slices.Contains(env, want) {
		return fmt.Errorf("runtime spec lacks env %s", want)
	}
	got, recorded := spec.Annotations[uuidsAnnotation]
	switch {
	case g.byPlugin && got != g.uuid:
		return fmt.Errorf("annotation %s=%q, want %q from nvinject-nri", uuidsAnnotation, got, g.uuid)
	case !g.byPlugin && recorded:
		return fmt.Errorf("annotation %s=%q on a native-CDI container: nvinject-nri acted on the baseline", uuidsAnnotation, got)
	}
	return nil
}

// uuidsAnnotation is where nvinject-nri records the GPUs it checked.
const uuidsAnnotation = contract.GPUUUIDsAnnotation
