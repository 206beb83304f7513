package injbench

import (
	"io"
	"log/slog"
	"os"
	"time"
)

// Bench runs one benchmark: its own containerd and nvinject-nri, N GPU
// containers per path, then a full teardown.
type Bench struct {
	log         *slog.Logger
	out         io.Writer
	toolsBin    string
	nvinjectBin string
	busybox     string
	layout      layout
	n, warmup   int
	timeout     time.Duration
}

// Option configures a Bench.
type Option func(*Bench)

// WithToolsBin sets the dir holding containerd, containerd-shim-runc-v2,
// ctr and runc (e2e/harness/tools/build.sh --print-bin).
func WithToolsBin(dir string) Option { return func(b *Bench) { b.toolsBin = dir } }

// WithNvinjectBin sets the dir holding nvinject-cdi, nvidia-smi-sim,
// nvinject-nri and pause (`make build` puts them in bin/).
func WithNvinjectBin(dir string) Option { return func(b *Bench) { b.nvinjectBin = dir } }

// WithBusybox sets the busybox binary put in the workload image.
func WithBusybox(path string) Option { return func(b *Bench) { b.busybox = path } }

// WithRunDir sets where containerd's state, sockets and logs live; keep it
// short (unix socket paths).
func WithRunDir(dir string) Option { return func(b *Bench) { b.layout = layout{dir: dir} } }

// WithContainers sets how many measured containers each path gets.
func WithContainers(n int) Option { return func(b *Bench) { b.n = n } }

// WithWarmup sets how many unmeasured containers each path gets first.
func WithWarmup(n int) Option { return func(b *Bench) { b.warmup = n } }

// WithTimeout bounds each CRI call and each daemon's start.
func WithTimeout(d time.Duration) Option { return func(b *Bench) { b.timeout = d } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(b *Bench) { b.log = l } }

// WithOutput sets where the report goes.
func WithOutput(w io.Writer) Option { return func(b *Bench) { b.out = w } }

// New returns a Bench with 20 containers per path and one warm-up each.
func New(opts ...Option) *Bench {
	b := &Bench{
		log: slog.Default(), out: os.Stdout, busybox: "/bin/busybox",
		layout: layout{dir: "/tmp/nvinject-injbench"}, n: 20, warmup: 1, timeout: time.Minute,
	}
	for _, o := range opts {
		o(b)
	}
	return b
}
