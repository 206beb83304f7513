package nodeconfig

import (
	"errors"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// load registers the group on a command, as each binary does, and parses;
// NODE_NAME is node-1 unless e says otherwise.
func load(args []string, e map[string]string) (*Config, error) {
	return loadWith(Defaults{MetricsAddr: ":1", StateDir: "/state"}, args, e)
}

func loadWith(d Defaults, args []string, e map[string]string) (*Config, error) {
	cmd := cli.New("test", "[flags]", cli.WithOutput(io.Discard, io.Discard), cli.WithEnvPrefix("NVINJECT_"))
	c := Register(cmd, d)
	if _, ok := e["NODE_NAME"]; !ok {
		e = maps.Clone(e)
		if e == nil {
			e = map[string]string{}
		}
		e["NODE_NAME"] = "node-1"
	}
	if err := cmd.Parse(args, env(e)); err != nil {
		return nil, err
	}
	return c, errors.Join(c.Validate()...)
}

func TestDefaults(t *testing.T) {
	c, err := load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.NVML != "real" || c.DriverRoot != "/" || c.CDISpecDir != "/var/run/cdi" || c.ResourceName != "nvidia.com/gpu" ||
		!c.Selector.All || c.QuietPeriod != 5*time.Minute || c.MIGRescan != 10*time.Second || c.HealthUpdate != time.Second || c.OnNVMLError != OnNVMLErrorWait ||
		c.PodResourcesSocket != DefaultPodResourcesSocket || c.MetricsAddr != ":1" || c.StateDir != "/state" || c.Log.Format != "json" ||
		!slices.Equal(c.IgnoredXids, []uint64{13, 31, 43, 45, 68, 109}) || c.MIGStrategy != gpuselect.MIGNone {
		t.Fatalf("defaults: %+v", c)
	}
}

// A binary's MIG default (nvinject-dra's mixed) yields to MIG_STRATEGY.
func TestMIGStrategyDefault(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want gpuselect.MIGStrategy
	}{
		{nil, gpuselect.MIGMixed},
		{map[string]string{"MIG_STRATEGY": "none"}, gpuselect.MIGNone},
	} {
		c, err := loadWith(Defaults{MIGStrategy: gpuselect.MIGMixed}, nil, tc.env)
		if err != nil {
			t.Fatal(err)
		}
		if c.MIGStrategy != tc.want {
			t.Errorf("env %v: MIG strategy %q; want %q", tc.env, c.MIGStrategy, tc.want)
		}
	}
}

// NVIDIA's names come before NVINJECT_<FLAG>; the command line wins.
func TestEnvAndFlagPrecedence(t *testing.T) {
	uuid := "GPU-4c8f1b0e-1a2b-5c3d-8e4f-0123456789ab"
	c, err := load([]string{"--on-nvml-error=exit"}, map[string]string{
		"NVIDIA_VISIBLE_DEVICES":   uuid,
		"NVINJECT_VISIBLE_DEVICES": "all",
		"MIG_STRATEGY":             "none",
		"NVINJECT_NVML":            "sim:a100-80gb*8,driver=535.261.03",
		"NVINJECT_HOOK_BINARY":     "/var/lib/nvinject/bin/nvinject-cdi-hook",
		"NVINJECT_ON_NVML_ERROR":   "wait",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.VisibleDevices != uuid || !slices.Equal(c.Selector.UUIDs, []string{uuid}) {
		t.Errorf("selection from NVIDIA_VISIBLE_DEVICES: %q %+v", c.VisibleDevices, c.Selector)
	}
	if c.NVML != "sim:a100-80gb*8,driver=535.261.03" || c.HookBinary != "/var/lib/nvinject/bin/nvinject-cdi-hook" {
		t.Errorf("from NVINJECT_<FLAG>: nvml %q, hook binary %q", c.NVML, c.HookBinary)
	}
	if c.OnNVMLError != OnNVMLErrorExit {
		t.Errorf("the flag should win over the environment: on-nvml-error %q", c.OnNVMLError)
	}
}

func TestRefusesInvalidValues(t *testing.T) {
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{env: map[string]string{"MIG_STRATEGY": "auto"}, want: `MIG_STRATEGY="auto"`},
		{env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "gpu0"}, want: `"gpu0" is neither`},
		{args: []string{"--visible-devices=GPU-a,,"}, want: "NVIDIA_VISIBLE_DEVICES"},
		{args: []string{"--nvml=cuda"}, want: `--nvml="cuda"`},
		{args: []string{"--ignored-xids=13,x"}, want: `"x" is not an Xid`},
		{args: []string{"--health-quiet-period=soon"}, want: `invalid value "soon" for flag -health-quiet-period`},
		{args: []string{"--health-quiet-period=-1s"}, want: `--health-quiet-period=-1s is negative`},
		{env: map[string]string{"NVINJECT_HEALTH_QUIET_PERIOD": "300"}, want: `NVINJECT_HEALTH_QUIET_PERIOD="300"`},
		{args: []string{"--health-update-interval=-1s"}, want: `--health-update-interval=-1s is negative`},
		{env: map[string]string{"NVINJECT_HEALTH_UPDATE_INTERVAL": "1"}, want: `NVINJECT_HEALTH_UPDATE_INTERVAL="1"`},
		{args: []string{"--mig-rescan-interval=-1s"}, want: `--mig-rescan-interval=-1s is negative`},
		{env: map[string]string{"NVINJECT_MIG_RESCAN_INTERVAL": "10"}, want: `NVINJECT_MIG_RESCAN_INTERVAL="10"`},
		{args: []string{"--on-nvml-error=retry"}, want: `--on-nvml-error="retry"`},
		{args: []string{"--resource-name=gpu"}, want: `--resource-name="gpu" is not a valid extended resource`},
		{args: []string{"--cdi-vendor=-x"}, want: `--cdi-vendor="-x"`},
		{args: []string{"--cdi-spec-dir=cdi"}, want: `--cdi-spec-dir="cdi" is not an absolute path`},
		{args: []string{"--hook-binary=bin/nvinject-cdi-hook"}, want: `--hook-binary="bin/nvinject-cdi-hook" is not an absolute path`},
		{env: map[string]string{"NVINJECT_POD_RESOURCES_SOCKET": "kubelet.sock"}, want: `--pod-resources-socket="kubelet.sock" is not an absolute path`},
	} {
		t.Run(tt.want, func(t *testing.T) {
			_, err := load(tt.args, tt.env)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("load(%v, %v) error = %v; want it to contain %s", tt.args, tt.env, err, tt.want)
			}
		})
	}
}

// TestPodResourcesSocket: on by default at kubelet's socket, set by flag or
// NVINJECT_POD_RESOURCES_SOCKET, off only when given empty.
func TestPodResourcesSocket(t *testing.T) {
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{want: "/var/lib/kubelet/pod-resources/kubelet.sock"},
		{env: map[string]string{"NVINJECT_POD_RESOURCES_SOCKET": "/k/pr.sock"}, want: "/k/pr.sock"},
		{args: []string{"--pod-resources-socket="}, env: map[string]string{"NVINJECT_POD_RESOURCES_SOCKET": "/k/pr.sock"}, want: ""},
	} {
		c, err := load(tt.args, tt.env)
		if err != nil || c.PodResourcesSocket != tt.want {
			t.Errorf("load(%v, %v): socket %v, %v; want %q", tt.args, tt.env, c, err, tt.want)
		}
	}
}

func TestParseXids(t *testing.T) {
	for in, want := range map[string][]uint64{"": nil, "none": nil, "79": {79}, " 13, 31 ,13": {13, 31}} {
		got, err := ParseXids(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseXids(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
}

func FuzzParseXids(f *testing.F) {
	for _, s := range []string{DefaultIgnoredXids, "none", "", "79", "1,,2", "-1", "18446744073709551616"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got, err := ParseXids(v)
		if err != nil {
			return
		}
		again, err := ParseXids(joinXids(got))
		if err != nil || !slices.Equal(again, got) {
			t.Fatalf("round trip of %q: %v -> %v, %v", v, got, again, err)
		}
	})
}

func joinXids(xs []uint64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(parts, ",")
}

// --node-labels needs the Node's name; so does a binary that always uses
// the API server, and the command line wins over NODE_NAME and KUBECONFIG.
func TestNodeNameAndLabels(t *testing.T) {
	dra := Defaults{APIAlways: true}
	tests := []struct {
		name    string
		d       Defaults
		args    []string
		env     map[string]string
		want    string // error substring; empty: valid
		warn    string // the one warning's substring; empty: none
		usesAPI bool
	}{
		{name: "labels by default", env: map[string]string{"NODE_NAME": "n", "KUBECONFIG": "/k"}, usesAPI: true},
		{name: "labels without a node name", env: map[string]string{"NODE_NAME": ""}, warn: "the GPU labels are not published"},
		{name: "no labels, no API", args: []string{"--node-labels=false"}, env: map[string]string{"NODE_NAME": ""}},
		{name: "no labels from the environment", env: map[string]string{"NODE_NAME": "", "NVINJECT_NODE_LABELS": "false"}},
		{name: "API always", d: dra, args: []string{"--node-labels=false"}, env: map[string]string{"NODE_NAME": ""}, want: "--node-name is empty; set NODE_NAME"},
		{name: "API always, named", d: dra, args: []string{"--node-labels=false", "--node-name=n"}, usesAPI: true},
		{name: "bad bool", args: []string{"--node-labels=maybe"}, want: "node-labels"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := loadWith(tt.d, tt.args, tt.env)
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("error %v; want it to say %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.UsesAPI() != tt.usesAPI {
				t.Errorf("UsesAPI %v, want %v", c.UsesAPI(), tt.usesAPI)
			}
			w := c.Warnings()
			if tt.warn == "" && len(w) != 0 || tt.warn != "" && (len(w) != 1 || !strings.Contains(w[0], tt.warn)) {
				t.Errorf("warnings %q; want one saying %q", w, tt.warn)
			}
		})
	}
	c, err := load([]string{"--node-name=cli", "--kubeconfig=/cli"}, map[string]string{"NODE_NAME": "env", "KUBECONFIG": "/env"})
	if err != nil || c.NodeName != "cli" || c.Kubeconfig != "/cli" {
		t.Errorf("node %q kubeconfig %q (%v); want the command line's", c.NodeName, c.Kubeconfig, err)
	}
}

// TestHealthUpdateInterval: 0 turns limiting off, and the effective
// configuration's log line says which interval runs.
func TestHealthUpdateInterval(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{nil, time.Second},
		{[]string{"--health-update-interval=0"}, 0},
		{[]string{"--health-update-interval=250ms"}, 250 * time.Millisecond},
	} {
		c, err := load(tc.args, nil)
		if err != nil {
			t.Fatal(err)
		}
		attrs := c.Attrs()
		i := slices.Index(attrs, any("health_update_interval"))
		if c.HealthUpdate != tc.want || i < 0 || attrs[i+1] != tc.want.String() {
			t.Errorf("%v: interval %s, logged %v; want %s", tc.args, c.HealthUpdate, attrs, tc.want)
		}
	}
}
