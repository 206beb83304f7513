// Package injbench measures what nvinject's injection path costs against
// containerd's own CDI injection, on a real containerd + runc started for
// the run (no kubelet): each GPU container's CRI CreateContainer +
// StartContainer wall time, both paths interleaved.
//
// Design of the comparison (printed with every report, see Design):
//
//   - (a) native: the GPU's CDI name in the CRI CDIDevices field (what
//     kubelet sends for a device plugin's CdiDevices), pod runtime handler
//     "runc-cdi". containerd's CRI resolves and injects it itself. A
//     cdi.k8s.io/ annotation cannot serve as the baseline: nvinject-nri
//     refuses nvinject's GPU kind named there outside its handlers, and
//     inside them it resolves and checks it (no longer native). containerd
//     2.2 does not pass CDIDevices to NRI (only 2.3 does), so nvinject-nri
//     is called for the container but has nothing to do; each sample checks
//     that (no nvinject.io/gpu-uuids annotation, no injection counted).
//   - (b) nvinject: the name only in the nvinject.io/cdi-devices container
//     annotation (device plugin strategy "nri"), handler "nvidia".
//     containerd ignores that key; nvinject-nri resolves the name, returns
//     the edits as an NRI adjustment and checks the UUID.
//
// Both paths pay containerd's NRI round trip to the connected plugin, as
// every container on a node running nvinject-nri does; the plugin's own
// handler time per container is reported beside the wall times. From
// containerd 2.3 on, NRI sees CDIDevices and nvinject-nri refuses (a)
// outside its handlers, so the run fails loudly rather than measure
// something else.
package injbench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nvinject/nvinject/shared/contract"
)

// Design is the one-line statement of what (a) and (b) are.
const Design = "a = containerd's own CDI: name in CRI CDIDevices, handler runc-cdi (nvinject-nri connected but not acting; containerd 2.2 does not pass CDIDevices to NRI); " +
	"b = nvinject: name only in nvinject.io/cdi-devices, handler nvidia, nvinject-nri applies the edits as an NRI adjustment and checks the UUID; " +
	"both pay the NRI round trip; timed span = CreateContainer+StartContainer, RunPodSandbox excluded"

// devicesAnnotation is the container annotation of device plugin strategy
// "nri"; containerd does not resolve it.
const devicesAnnotation = contract.DevicesAnnotation

// path is one way of giving a container the GPU.
type path struct {
	key, label, handler string
	byPlugin            bool
}

var (
	pathNative = path{key: "a", label: "containerd CDI (CRI CDIDevices, " + HandlerNative + ")", handler: HandlerNative}
	pathNRI    = path{key: "b", label: "nvinject-nri (" + devicesAnnotation + ", " + HandlerNRI + ")", handler: HandlerNRI, byPlugin: true}
)

func (p path) container(cdiName string) *cri.ContainerConfig {
	cfg := &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: "gpu"},
		Image:    &cri.ImageSpec{Image: workloadImage},
		Linux: &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{
			NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_NODE},
		}},
	}
	if p.byPlugin {
		cfg.Annotations = map[string]string{devicesAnnotation: cdiName}
	} else {
		cfg.CDIDevices = []*cri.CDIDevice{{Name: cdiName}}
	}
	return cfg
}

// Sample is one measured container.
type Sample struct {
	Path        string
	Iteration   int
	Sandbox     time.Duration // RunPodSandbox, not part of the timed span
	CreateStart time.Duration // CreateContainer + StartContainer
	Plugin      time.Duration // nvinject-nri's CreateContainer handler time
	Remove      time.Duration // StopPodSandbox + RemovePodSandbox
}

// Result is a finished run.
type Result struct {
	Runtime string
	Samples []Sample
}

// env is what a running benchmark holds.
type env struct {
	cri        *criClient
	metricsURL string
	cdiName    string
	uuid       string
}

// Run starts containerd and nvinject-nri, measures, and tears everything
// down, also when measuring fails.
func (b *Bench) Run(ctx context.Context) (res *Result, err error) {
	if b.n < 1 || b.warmup < 0 {
		return nil, fmt.Errorf("need at least 1 container per path and no negative warm-up (got %d, %d)", b.n, b.warmup)
	}
	if err := b.preflight(); err != nil {
		return nil, err
	}
	if err := b.prepareRunDir(ctx); err != nil {
		return nil, err
	}
	var ctrd, plugin *daemon
	var client *criClient
	defer func() {
		if tdErr := b.teardown(context.WithoutCancel(ctx), client, plugin, ctrd); tdErr != nil {
			err = errors.Join(err, fmt.Errorf("teardown: %w", tdErr))
		}
	}()
	e := env{}
	if e.cdiName, e.uuid, err = writeCDISpec(ctx, b.nvinject("nvinject-cdi"), b.layout); err != nil {
		return nil, err
	}
	archives, err := writeImages(b.layout, b.nvinject("pause"), b.busybox)
	if err != nil {
		return nil, err
	}
	if ctrd, client, err = b.startContainerd(ctx); err != nil {
		return nil, err
	}
	e.cri = client
	runtime, err := client.version(ctx)
	if err != nil {
		return nil, err
	}
	if err := importImages(ctx, b.tool("ctr"), b.layout.containerdSocket(), archives); err != nil {
		return nil, err
	}
	if plugin, e.metricsURL, err = b.startPlugin(ctx); err != nil {
		return nil, err
	}
	b.log.Info("measuring", "runtime", runtime, "containersPerPath", b.n, "warmup", b.warmup, "device", e.cdiName)
	samples, err := b.measure(ctx, e)
	if err != nil {
		return nil, err
	}
	return &Result{Runtime: runtime, Samples: samples}, nil
}

// measure interleaves the paths in ABBA order, so neither always runs
// right after the other's teardown; warm-up iterations are dropped.
func (b *Bench) measure(ctx context.Context, e env) ([]Sample, error) {
	var out []Sample
	for i := -b.warmup; i < b.n; i++ {
		order := []path{pathNative, pathNRI}
		if (i+b.warmup)%2 == 1 {
			slices.Reverse(order)
		}
		for _, p := range order {
			s, err := b.one(ctx, e, p, i)
			if err != nil {
				return nil, fmt.Errorf("path %s, iteration %d: %w", p.key, i, err)
			}
			if i >= 0 {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// one runs, checks and removes one GPU pod.
func (b *Bench) one(ctx context.Context, e env, p path, i int) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	name := p.key + "-" + strconv.Itoa(i)
	if i < 0 {
		name = p.key + "-warmup" + strconv.Itoa(-i)
	}
	s := Sample{Path: p.key, Iteration: i}
	before, err := scrape(ctx, e.metricsURL)
	if err != nil {
		return s, err
	}
	t := time.Now()
	pd, err := e.cri.runPod(ctx, name, p.handler)
	if err != nil {
		return s, err
	}
	s.Sandbox = time.Since(t)
	t = time.Now()
	id, err := e.cri.createAndStart(ctx, pd, p.container(e.cdiName))
	if err != nil {
		return s, err
	}
	s.CreateStart = time.Since(t)
	after, err := scrape(ctx, e.metricsURL)
	if err != nil {
		return s, err
	}
	injected, handler, calls := after.sub(before)
	if calls != 1 {
		return s, fmt.Errorf("nvinject-nri handled %d CreateContainer calls for one container; is it connected to %s?", calls, b.layout.nriSocket())
	}
	if want := map[bool]float64{true: 1, false: 0}[p.byPlugin]; injected != want {
		return s, fmt.Errorf("nvinject-nri counted %v injections, want %v (see %s)", injected, want, b.logFile("nvinject-nri"))
	}
	s.Plugin = handler
	spec, err := e.cri.runtimeSpec(ctx, id)
	if err != nil {
		return s, err
	}
	if err := (gpuCheck{uuid: e.uuid, byPlugin: p.byPlugin}).check(spec); err != nil {
		return s, fmt.Errorf("container %s: %w", name, err)
	}
	if _, err := e.cri.exec(ctx, id, "/bin/busybox", "test", "-c", gpuNode.Path); err != nil {
		return s, fmt.Errorf("container %s has no %s inside: %w", name, gpuNode.Path, err)
	}
	t = time.Now()
	if err := e.cri.removePod(ctx, pd.id); err != nil {
		return s, err
	}
	s.Remove = time.Since(t)
	return s, nil
}

func (b *Bench) tool(name string) string     { return filepath.Join(b.toolsBin, name) }
func (b *Bench) nvinject(name string) string { return filepath.Join(b.nvinjectBin, name) }
func (b *Bench) logFile(name string) string  { return filepath.Join(b.layout.logs(), name+".log") }

// preflight checks the programs and privileges needed before touching the host.
func (b *Bench) preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("injbench runs containerd and runc: run it as root")
	}
	var errs []error
	for _, f := range []string{b.tool("containerd"), b.tool("containerd-shim-runc-v2"), b.tool("ctr"), b.tool("runc")} {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("%w (run `make tools` and pass -tools-bin $(e2e/harness/tools/build.sh --print-bin))", err))
		}
	}
	for _, f := range []string{b.nvinject("nvinject-cdi"), b.nvinject("nvidia-smi-sim"), b.nvinject("nvinject-nri"), b.nvinject("pause")} {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("%w (run `make build` and pass -bin bin)", err))
		}
	}
	if _, err := os.Stat(b.busybox); err != nil {
		errs = append(errs, fmt.Errorf("%w (apt-get install busybox-static, or pass -busybox)", err))
	}
	return errors.Join(errs...)
}

// startContainerd starts containerd with the rendered config and waits
// until its CRI answers.
func (b *Bench) startContainerd(ctx context.Context) (*daemon, *criClient, error) {
	cfg := newContainerdConfig(b.layout, b.tool("runc"), sandboxImage)
	for _, d := range append(cfg.dirs(), b.layout.logs()) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	text, err := cfg.render()
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(b.layout.containerdConfig(), text, 0o644); err != nil {
		return nil, nil, fmt.Errorf("write containerd config: %w", err)
	}
	// containerd finds containerd-shim-runc-v2 on its PATH.
	d, err := startDaemon("containerd", b.logFile("containerd"), []string{"PATH=" + b.toolsBin + ":" + os.Getenv("PATH")},
		b.tool("containerd"), "--config", b.layout.containerdConfig())
	if err != nil {
		return nil, nil, err
	}
	client, err := dialCRI(b.layout.containerdSocket())
	if err != nil {
		return d, nil, err
	}
	err = poll(ctx, d, b.timeout, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := client.version(cctx)
		return err
	})
	return d, client, err
}

// startPlugin runs nvinject-nri as a host process against containerd's NRI
// socket and waits until it is registered.
func (b *Bench) startPlugin(ctx context.Context) (*daemon, string, error) {
	addr, err := freeLoopbackAddr()
	if err != nil {
		return nil, "", err
	}
	d, err := startDaemon("nvinject-nri", b.logFile("nvinject-nri"), nil, b.nvinject("nvinject-nri"),
		"--socket-path", b.layout.nriSocket(), "--cdi-spec-dir", b.layout.cdiDir(), "--nvml", simNode,
		"--metrics-addr", addr, "--runtime-handler", HandlerNRI)
	if err != nil {
		return nil, "", err
	}
	err = poll(ctx, d, b.timeout, func(ctx context.Context) error { return httpOK(ctx, "http://"+addr+"/readyz") })
	return d, "http://" + addr + "/metrics", err
}

// freeLoopbackAddr picks a free port; nvinject-nri does not report the
// port of ":0", so the benchmark chooses one.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}
