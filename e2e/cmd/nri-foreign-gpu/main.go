// Command nri-foreign-gpu is TEST EQUIPMENT for nvinject's fault matrix: an
// NRI plugin that runs after nvinject (a higher index) and adds a GPU node
// that was not allocated (by default /dev/nvidia1, char 195:1) to every
// container it is asked about. nvinject-nri's validator must refuse each of
// those containers. Never run it on a node that serves real workloads.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"

	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/gpu"
)

const name = "nri-foreign-gpu"

func main() {
	os.Exit(cli.Code(name, run(os.Args[1:]), os.Stderr))
}

func run(args []string) error {
	cmd := cli.New(name, "[flags]", cli.WithAbout("TEST EQUIPMENT: an NRI plugin adding a foreign GPU node to every container, to prove nvinject-nri refuses it."))
	fs := cmd.Flags()
	socket := fs.String("socket-path", "/var/run/nri/nri.sock", "NRI socket of the runtime")
	idx := fs.String("plugin-idx", "90", "NRI plugin index (two digits; higher than nvinject's, so it runs after it)")
	minor := fs.Int64("minor", 1, "minor of the GPU node to add (/dev/nvidia<minor>, char 195:<minor>)")
	if err := cmd.Parse(args, nil); err != nil {
		return err
	}
	if len(cmd.Args()) > 0 {
		return cli.Usagef("unexpected arguments %q; %s takes flags only", cmd.Args(), name)
	}
	if *minor < 0 || *minor >= gpu.ModesetMinor {
		return cli.Usagef("--minor=%d must name a GPU node, 0..%d", *minor, gpu.ModesetMinor-1)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p := plugin{log: log, node: &api.LinuxDevice{Path: fmt.Sprintf("/dev/nvidia%d", *minor), Type: "c", Major: gpu.NVIDIAMajor, Minor: *minor}}
	closed := make(chan struct{})
	s, err := stub.New(p, stub.WithPluginName("foreign-gpu"), stub.WithPluginIdx(*idx), stub.WithSocketPath(*socket),
		stub.WithOnClose(func() { close(closed) }))
	if err != nil {
		return cli.Usagef("NRI plugin %s-foreign-gpu: %w", *idx, err)
	}
	if err := s.Start(ctx); err != nil {
		return fmt.Errorf("register with NRI at %s: %w; is containerd running with NRI enabled?", *socket, err)
	}
	log.Info("registered with NRI; adding a foreign GPU to every container", "socket", *socket, "plugin", *idx+"-foreign-gpu", "node", p.node.GetPath())
	select {
	case <-ctx.Done():
		s.Stop()
		return nil
	case <-closed:
		return errors.New("the runtime closed the NRI connection")
	}
}

type plugin struct {
	log  *slog.Logger
	node *api.LinuxDevice
}

func (p plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj := &api.ContainerAdjustment{}
	adj.AddDevice(p.node)
	p.log.Info("adding foreign GPU", "pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName(), "node", p.node.GetPath())
	return adj, nil, nil
}
