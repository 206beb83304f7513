package injbench

import (
	"strings"
	"testing"

	toml "github.com/pelletier/go-toml/v2"
)

func TestContainerdConfigRenders(t *testing.T) {
	l := layout{dir: "/tmp/ib"}
	text, err := newContainerdConfig(l, "/tools/runc", sandboxImage).render()
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Version int
		Root    string
		State   string
		GRPC    struct{ Address string } `toml:"grpc"`
		Plugins map[string]map[string]any
	}
	if err := toml.Unmarshal(text, &cfg); err != nil {
		t.Fatalf("rendered config is not TOML: %v\n%s", err, text)
	}
	if cfg.Version != 3 || cfg.Root != "/tmp/ib/containerd/root" || cfg.State != "/tmp/ib/containerd/state" || cfg.GRPC.Address != l.containerdSocket() {
		t.Errorf("paths = version %d root %q state %q grpc %q; want everything under the run dir", cfg.Version, cfg.Root, cfg.State, cfg.GRPC.Address)
	}
	nri := cfg.Plugins["io.containerd.nri.v1.nri"]
	if nri["disable"] != false || nri["socket_path"] != l.nriSocket() {
		t.Errorf("NRI = %v; want enabled on %s", nri, l.nriSocket())
	}
	images := cfg.Plugins["io.containerd.cri.v1.images"]
	if pinned, _ := images["pinned_images"].(map[string]any); pinned["sandbox"] != sandboxImage {
		t.Errorf("pinned sandbox = %v, want %s", images["pinned_images"], sandboxImage)
	}
	rt := cfg.Plugins["io.containerd.cri.v1.runtime"]
	if rt["restrict_oom_score_adj"] != true || rt["enable_cdi"] != true {
		t.Errorf("runtime = %v; want restrict_oom_score_adj and enable_cdi", rt)
	}
	if dirs, _ := rt["cdi_spec_dirs"].([]any); len(dirs) != 1 || dirs[0] != l.cdiDir() {
		t.Errorf("cdi_spec_dirs = %v, want only %s", rt["cdi_spec_dirs"], l.cdiDir())
	}
	runtimes := rt["containerd"].(map[string]any)["runtimes"].(map[string]any)
	for _, h := range []string{"runc", HandlerNative, HandlerNRI} {
		r, ok := runtimes[h].(map[string]any)
		if !ok {
			t.Errorf("runtime handler %q missing; have %v", h, runtimes)
			continue
		}
		opts := r["options"].(map[string]any)
		if r["runtime_type"] != "io.containerd.runc.v2" || opts["BinaryName"] != "/tools/runc" || opts["Root"] != "/tmp/ib/runc" {
			t.Errorf("handler %s = %v; want the pinned runc with its root under the run dir", h, r)
		}
	}
}

func TestSocketPathsFitDefaultRunDir(t *testing.T) {
	l := New().layout
	for _, p := range []string{l.containerdSocket(), l.nriSocket()} {
		if len(p) >= 100 || !strings.HasPrefix(p, l.dir) {
			t.Errorf("socket %s: want under %s and shorter than 100 bytes", p, l.dir)
		}
	}
}
