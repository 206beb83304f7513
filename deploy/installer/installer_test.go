package installer

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/nvinject/nvinject/deploy"
)

var fixedClock = func() time.Time { return time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC) }

type node struct {
	config, dropInDir string
}

// newNode lays out a node's /etc/containerd in a temp dir; seed is the
// testdata file to use as config.toml, "" for a host without one.
func newNode(t *testing.T, seed string) node {
	t.Helper()
	root := t.TempDir()
	n := node{config: filepath.Join(root, "etc/containerd/config.toml"), dropInDir: filepath.Join(root, "etc/containerd/conf.d")}
	if seed != "" {
		data, err := os.ReadFile(filepath.Join("testdata", seed))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(n.config), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(n.config, data, 0o640); err != nil {
			t.Fatal(err)
		}
		// The file the 2.4 fixture imports besides conf.d.
		if err := os.WriteFile(filepath.Join(filepath.Dir(n.config), "mirrors.toml"), []byte("version = 3\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func (n node) install(t *testing.T, dryRun bool) ([]Change, error) {
	t.Helper()
	return New(
		WithConfigPath(n.config),
		WithDropInDir(n.dropInDir),
		WithDryRun(dryRun),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		WithClock(fixedClock),
	).Install()
}

func readTOML(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string]any{}
	if err := toml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s is not TOML after install: %v\n%s", path, err, data)
	}
	return doc
}

func TestInstall(t *testing.T) {
	tests := []struct {
		name        string
		seed        string
		wantActions []string // config.toml's, then the drop-in's, in plan order
		wantImports []string // relative to the node's /etc/containerd
		keepText    []string // lines of the old config that must survive
	}{
		{
			name:        "fresh host without config.toml",
			wantActions: []string{"create", "create"},
			wantImports: []string{"conf.d/*.toml"},
		},
		{
			name:        "containerd 2.2 default config",
			seed:        "containerd-2.2.toml",
			wantActions: []string{"create", "update"},
			wantImports: []string{"conf.d/*.toml"},
			keepText:    []string{"# containerd 2.2 `containerd config default` shape", "SystemdCgroup = true", "enable_cdi = true"},
		},
		{
			name:        "containerd 2.4 config with comments and imports",
			seed:        "containerd-2.4.toml",
			wantActions: []string{"create", "update"},
			wantImports: []string{"mirrors.toml", "conf.d/*.toml"},
			keepText:    []string{"  # site-wide registry mirrors", "  'mirrors.toml',"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, tc.seed)
			var before []byte
			if tc.seed != "" {
				before, _ = os.ReadFile(n.config)
			}
			changes, err := n.install(t, false)
			if err != nil {
				t.Fatalf("Install: %v", err)
			}
			var actions []string
			for _, c := range changes {
				actions = append(actions, c.Action)
			}
			if !slices.Equal(actions, tc.wantActions) {
				t.Errorf("actions = %v, want %v (%+v)", actions, tc.wantActions, changes)
			}

			dropIn, err := os.ReadFile(filepath.Join(n.dropInDir, DropInName))
			if err != nil || !bytes.Equal(dropIn, deploy.ContainerdDropIn) {
				t.Errorf("drop-in differs from deploy/containerd/nvinject.toml (err %v)", err)
			}
			doc := readTOML(t, n.config)
			if doc["version"] != int64(3) {
				t.Errorf("version = %v, want 3", doc["version"])
			}
			etc := filepath.Dir(n.config)
			var want []any
			for _, imp := range tc.wantImports {
				if imp != "mirrors.toml" {
					imp = filepath.Join(etc, imp)
				}
				want = append(want, imp)
			}
			if got, _ := doc["imports"].([]any); !slices.Equal(got, want) {
				t.Errorf("imports = %v, want %v", got, want)
			}
			after, _ := os.ReadFile(n.config)
			for _, line := range tc.keepText {
				if !bytes.Contains(after, []byte(line)) {
					t.Errorf("config lost %q:\n%s", line, after)
				}
			}
			if tc.seed != "" {
				backup := n.config + ".20261130T120000Z.bak"
				if got, err := os.ReadFile(backup); err != nil || !bytes.Equal(got, before) {
					t.Errorf("backup %s does not hold the old config (err %v)", backup, err)
				}
				if st, _ := os.Stat(n.config); st.Mode().Perm() != 0o640 {
					t.Errorf("config mode = %v, want the old 0640", st.Mode().Perm())
				}
			}

			again, err := n.install(t, false)
			if err != nil || len(again) != 0 {
				t.Errorf("second Install = %+v, %v; want no changes", again, err)
			}
		})
	}
}

func TestInstallRefuses(t *testing.T) {
	tests := []struct {
		name    string
		seed    string
		wantErr error
		wantMsg string
	}{
		{"version 2 config", "containerd-v2.toml", ErrNeedsMigration, "containerd config migrate"},
		{"NRI disabled", "containerd-nri-disabled.toml", ErrConflict, "disable = true"},
		{"import of a missing file", "containerd-missing-import.toml", ErrConflict, "containerd skips every import after it"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, tc.seed)
			before, _ := os.ReadFile(n.config)
			_, err := n.install(t, false)
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("Install error = %v, want %v mentioning %q", err, tc.wantErr, tc.wantMsg)
			}
			after, _ := os.ReadFile(n.config)
			if !bytes.Equal(before, after) {
				t.Error("refused install changed config.toml")
			}
			if _, err := os.Stat(n.dropInDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("refused install created %s (err %v)", n.dropInDir, err)
			}
		})
	}
}

func TestInstallDryRunWritesNothing(t *testing.T) {
	for _, seed := range []string{"", "containerd-2.2.toml"} {
		n := newNode(t, seed)
		before, _ := os.ReadFile(n.config)
		entriesBefore, _ := os.ReadDir(filepath.Dir(n.config))
		changes, err := n.install(t, true)
		if err != nil || len(changes) != 2 {
			t.Fatalf("dry run = %+v, %v; want 2 planned changes", changes, err)
		}
		after, _ := os.ReadFile(n.config)
		if !bytes.Equal(before, after) {
			t.Errorf("seed %q: dry run changed config.toml", seed)
		}
		entries, _ := os.ReadDir(filepath.Dir(n.config))
		if len(entries) != len(entriesBefore) {
			t.Errorf("seed %q: dry run left files: %v", seed, entries)
		}
	}
}

// TestContainerdAcceptsMergedConfig loads the installed result with the
// pinned containerd (`make tools`): it must parse it, follow the import and
// show the drop-in's settings in its effective configuration.
func TestContainerdAcceptsMergedConfig(t *testing.T) {
	bin := os.Getenv("NVINJECT_TOOLS_BIN")
	if bin == "" {
		t.Skip("NVINJECT_TOOLS_BIN is unset: run `make tools` and set it to the tools bin dir (make test does) to check the config with a real containerd")
	}
	containerd := filepath.Join(bin, "containerd")
	if _, err := os.Stat(containerd); err != nil {
		t.Fatalf("NVINJECT_TOOLS_BIN=%s has no containerd: %v; rerun `make tools`", bin, err)
	}
	for _, seed := range []string{"", "containerd-2.2.toml", "containerd-2.4.toml"} {
		t.Run("seed="+seed, func(t *testing.T) {
			n := newNode(t, seed)
			if _, err := n.install(t, false); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(containerd, "--config", n.config, "config", "dump").Output()
			if err != nil {
				t.Fatalf("containerd config dump: %v\n%s", err, exitStderr(err))
			}
			dump := map[string]any{}
			if err := toml.Unmarshal(out, &dump); err != nil {
				t.Fatalf("parse dump: %v\n%s", err, out)
			}
			checks := []struct {
				keys []string
				want any
			}{
				{[]string{"plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "nvidia", "runtime_type"}, "io.containerd.runc.v2"},
				{[]string{"plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "nvidia", "options", "BinaryName"}, "runc"},
				{[]string{"plugins", "io.containerd.nri.v1.nri", "default_validator", "enable"}, true},
				{[]string{"plugins", "io.containerd.nri.v1.nri", "disable"}, false},
				{[]string{"plugins", "io.containerd.nri.v1.nri", "socket_path"}, "/var/run/nri/nri.sock"},
			}
			for _, c := range checks {
				if got := lookup(dump, c.keys...); got != c.want {
					t.Errorf("%s = %v, want %v", strings.Join(c.keys, "."), got, c.want)
				}
			}
			dirs, _ := stringList(lookup(dump, "plugins", "io.containerd.cri.v1.runtime", "cdi_spec_dirs"))
			if !slices.Equal(dirs, []string{"/etc/cdi", "/var/run/cdi"}) {
				t.Errorf("cdi_spec_dirs = %v", dirs)
			}
		})
	}
}

func exitStderr(err error) []byte {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.Stderr
	}
	return nil
}
