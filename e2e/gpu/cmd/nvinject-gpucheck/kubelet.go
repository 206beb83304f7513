package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/contract"
)

// registrar is the Registration service: it hands each request to the run.
type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	reqs chan *pluginapi.RegisterRequest
}

func (r *registrar) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	select {
	case r.reqs <- req:
		return &pluginapi.Empty{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func kubeletCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := cli.New(name+" kubelet", "--dir DIR [--for 20s]", cli.WithOutput(stdout, stderr),
		cli.WithAbout("A stand-in kubelet for one device plugin: Registration on DIR/kubelet.sock, then ListAndWatch (every update printed) and one Allocate of a Healthy device. Exit 0 when the plugin registered, reported a Healthy device and Allocate answered CDI names."))
	dir := c.Flags().String("dir", "", "the device-plugin directory (the plugin's --kubelet-dir)")
	dur := c.Flags().Duration("for", 20*time.Second, "how long to watch the plugin's device health")
	resource := c.Flags().String("resource-name", contract.ResourceName, "the resource the plugin must register")
	if done, err := parse(c, args); done || err != nil {
		return err
	}
	if *dir == "" {
		return cli.Usagef("--dir is required: the directory the device plugin's --kubelet-dir names")
	}
	ctx, cancel := context.WithTimeout(ctx, *dur)
	defer cancel()
	return watchPlugin(ctx, *dir, *resource, stdout)
}

// watchPlugin serves Registration until one plugin registers, then watches it
// until ctx ends.
func watchPlugin(ctx context.Context, dir, resource string, out io.Writer) error {
	start := time.Now()
	logf := func(format string, a ...any) {
		fmt.Fprintf(out, "[kubelet %6.2fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
	}
	sock := filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w; is a real kubelet using that directory?", sock, err)
	}
	reg := &registrar{reqs: make(chan *pluginapi.RegisterRequest, 1)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, reg)
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	defer func() {
		srv.Stop()
		wg.Wait()
		_ = os.Remove(sock)
	}()
	logf("Registration serving on %s", sock)

	var req *pluginapi.RegisterRequest
	select {
	case req = <-reg.reqs:
	case <-ctx.Done():
		return fmt.Errorf("no device plugin registered on %s: %w; check the plugin's --kubelet-dir and its log", sock, ctx.Err())
	}
	logf("Register: resource %s, endpoint %s, API %s", req.ResourceName, req.Endpoint, req.Version)
	if req.ResourceName != resource || req.Version != pluginapi.Version {
		return fmt.Errorf("the plugin registered %s (API %s); want %s (API %s)", req.ResourceName, req.Version, resource, pluginapi.Version)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial the plugin at %s: %w", req.Endpoint, err)
	}
	defer conn.Close()
	return watch(ctx, pluginapi.NewDevicePluginClient(conn), logf)
}

// watch prints ListAndWatch updates until ctx ends and allocates the first
// Healthy device.
func watch(ctx context.Context, client pluginapi.DevicePluginClient, logf func(string, ...any)) error {
	// The stream ends when ctx does, but its context carries no deadline:
	// gRPC would send it to the plugin, whose handler could then end the
	// stream cleanly (EOF) a moment before ctx reports the deadline here.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	stream, err := client.ListAndWatch(sctx, &pluginapi.Empty{})
	if err != nil {
		return fmt.Errorf("ListAndWatch: %w", err)
	}
	var healthy, allocated bool
	for {
		resp, err := stream.Recv()
		if err != nil {
			if ctx.Err() == nil {
				return fmt.Errorf("ListAndWatch ended: %w", err)
			}
			break
		}
		var devs []string
		var first string
		for _, d := range resp.Devices {
			devs = append(devs, d.ID+" "+d.Health)
			if d.Health == pluginapi.Healthy && first == "" {
				first = d.ID
			}
		}
		logf("ListAndWatch: %d devices: %s", len(resp.Devices), strings.Join(devs, ", "))
		healthy = healthy || first != ""
		if first != "" && !allocated {
			r, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{first}}}})
			if err != nil {
				return fmt.Errorf("allocate %s: %w", first, err)
			}
			var names []string
			for _, cr := range r.ContainerResponses {
				for _, d := range cr.CdiDevices {
					names = append(names, d.Name)
				}
				for k, v := range cr.Annotations {
					names = append(names, k+"="+v)
				}
			}
			logf("Allocate %s: CDI %s", first, strings.Join(names, " "))
			if len(names) == 0 {
				return fmt.Errorf("the plugin's Allocate of %s answered no CDI device", first)
			}
			allocated = true
		}
	}
	logf("watched until the end of --for")
	if !healthy {
		return errors.New("the plugin never reported a Healthy device")
	}
	return nil
}
