package driver_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/cdi/driver"
)

// tree writes files into a new root: "" an empty file, "->t" a symlink,
// "elf" a copy of an ELF program (this test's own binary), "x:TEXT" an
// executable with TEXT, "dir/" a directory, anything else a file's text.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	for p, v := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.HasPrefix(v, "->"):
			err = os.Symlink(v[2:], full)
		case v == "dir/":
			err = os.MkdirAll(full, 0o755)
		case v == "elf":
			err = os.WriteFile(full, prog, 0o755)
		case strings.HasPrefix(v, "x:"):
			err = os.WriteFile(full, []byte(v[2:]), 0o755)
		default:
			err = os.WriteFile(full, []byte(v), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const ver = "535.261.03"

// The driver where real hosts keep it: a /usr/local/nvidia directory
// reached through ld.so.conf.d, links and wrapper scripts (the H200 host's
// layout), and a driver directory that is the whole root (GKE's).
func TestFindLayouts(t *testing.T) {
	nv := "/usr/local/nvidia"
	usrlocal := tree(t, map[string]string{
		"/etc/ld.so.conf":                                 "include /etc/ld.so.conf.d/*.conf\n",
		"/etc/ld.so.conf.d/nvidia.conf":                   nv + "/lib64\n/usr/lib/i386-linux-gnu\n",
		nv + "/lib64/libnvidia-ml.so." + ver:              "",
		nv + "/lib64/libnvidia-ml.so.1":                   "->libnvidia-ml.so." + ver,
		nv + "/lib64/libcuda.so." + ver:                   "",
		"/usr/lib/i386-linux-gnu/libcuda.so." + ver:       "",
		"/usr/lib/libcuda.so.1":                           "->" + nv + "/lib64/libcuda.so." + ver,
		nv + "/bin/nvidia-smi":                            "elf",
		nv + "/bin/nvidia-cuda-mps-server":                "elf",
		"/usr/bin/nvidia-smi":                             "x:#!/bin/sh\nexec " + nv + "/bin/nvidia-smi \"$@\"\n",
		"/usr/bin/nvidia-debugdump":                       "x:#!/bin/sh\nexec " + nv + "/bin/nvidia-debugdump \"$@\"\n",
		nv + "/firmware/nvidia/" + ver + "/gsp_ga10x.bin": "",
	})
	gke := tree(t, map[string]string{
		"/lib64/libnvidia-ml.so." + ver:              "",
		"/lib64/libcuda.so." + ver:                   "",
		"/bin/nvidia-smi":                            "elf",
		"/firmware/nvidia/" + ver + "/gsp_ga10x.bin": "",
	})
	for _, tt := range []struct {
		name, root, prefix string
		libs, dirs         []string
		bins               map[string]string // container path: source in the root
		firmware           map[string]string
	}{
		{
			name: "usrlocal", root: usrlocal,
			libs:     []string{nv + "/lib64/libcuda.so." + ver, nv + "/lib64/libnvidia-ml.so." + ver},
			dirs:     []string{nv + "/lib64"},
			bins:     map[string]string{"/usr/bin/nvidia-smi": nv + "/bin/nvidia-smi", "/usr/bin/nvidia-cuda-mps-server": nv + "/bin/nvidia-cuda-mps-server"},
			firmware: map[string]string{"/lib/firmware/nvidia/" + ver + "/gsp_ga10x.bin": nv + "/firmware/nvidia/" + ver + "/gsp_ga10x.bin"},
		},
		{
			name: "gke", root: gke, prefix: driver.DriverDirPrefix,
			libs:     []string{"/lib64/libcuda.so." + ver, "/lib64/libnvidia-ml.so." + ver},
			dirs:     []string{nv + "/lib64"},
			bins:     map[string]string{"/usr/bin/nvidia-smi": "/bin/nvidia-smi"},
			firmware: map[string]string{"/lib/firmware/nvidia/" + ver + "/gsp_ga10x.bin": "/firmware/nvidia/" + ver + "/gsp_ga10x.bin"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, err := driver.Find(tt.root, ver, "NVML")
			if err != nil {
				t.Fatal(err)
			}
			var libs []string
			for _, l := range f.Libraries {
				libs = append(libs, l.File)
			}
			if !slices.Equal(libs, tt.libs) || f.Prefix != tt.prefix || !slices.Equal(f.LibDirs(), tt.dirs) {
				t.Errorf("libraries %v under %q in %v; want %v under %q in %v", libs, f.Prefix, f.LibDirs(), tt.libs, tt.prefix, tt.dirs)
			}
			for _, x := range []struct {
				what string
				got  []driver.File
				want map[string]string
			}{{"binaries", f.Binaries, tt.bins}, {"firmware", f.Firmware, tt.firmware}} {
				got := map[string]string{}
				for _, b := range x.got {
					got[b.Path] = b.Source
				}
				if len(got) != len(x.want) {
					t.Errorf("%s %v; want %v", x.what, got, x.want)
				}
				for p, src := range x.want {
					if got[p] != src {
						t.Errorf("%s %v; want %s from %s", x.what, got, p, src)
					}
				}
			}
		})
	}
}

func TestWrapperTarget(t *testing.T) {
	for _, tt := range []struct {
		script, want string
	}{
		{"#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n", "/usr/local/nvidia/bin/nvidia-smi"},
		{"#!/bin/bash\n# the driver lives elsewhere\nset -e\nexec -a nvidia-smi '/opt/nv/nvidia-smi' \"$@\"\n", "/opt/nv/nvidia-smi"},
		{"#!/bin/sh\nexec $NVDIR/nvidia-smi\n", ""},
		{"#!/bin/sh\nexec ../bin/nvidia-smi\n", ""},
		{"#!/bin/sh\nexec /opt/../etc/x\n", ""},
		{"#!/bin/sh\necho simulated\n", ""},
		{"exec /bin/x\n", ""},
		{"#!/bin/sh\nexec /bin/nvidia-*\n", ""},
		{"#!/bin/sh\nexec\n", ""},
	} {
		got, ok := driver.WrapperTarget([]byte(tt.script))
		if got != tt.want || ok != (tt.want != "") {
			t.Errorf("WrapperTarget(%q) = %q, %v; want %q", tt.script, got, ok, tt.want)
		}
	}
}

// FuzzWrapperTarget: any script gives either nothing or one clean
// absolute path without shell expansion.
func FuzzWrapperTarget(f *testing.F) {
	f.Add([]byte("#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n"))
	f.Add([]byte("#!/bin/sh\nexec -a x '/a b'\n"))
	f.Fuzz(func(t *testing.T, script []byte) {
		p, ok := driver.WrapperTarget(script)
		if !ok {
			if p != "" {
				t.Fatalf("no target but %q", p)
			}
			return
		}
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.ContainsAny(p, "$`*?~\n") {
			t.Fatalf("target %q is not a clean absolute path", p)
		}
	})
}

// A merged-/usr root reaches its libraries through /lib -> usr/lib too; that
// alias is no link of its own (in a merged-/usr image it is the mounted file,
// and a link made there fails).
func TestFindMergedUsr(t *testing.T) {
	root := tree(t, map[string]string{
		"/lib":                          "->usr/lib",
		lib + "/libnvidia-ml.so." + ver: "",
		lib + "/libnvidia-ml.so.1":      "->libnvidia-ml.so." + ver,
		lib + "/libcuda.so." + ver:      "",
		"/usr/bin/nvidia-smi":           "elf",
	})
	f, err := driver.Find(root, ver, "NVML")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range f.Libraries {
		if len(l.Links) > 0 || !strings.HasPrefix(l.File, lib+"/") {
			t.Errorf("library %+v; want it in %s with no links", l, lib)
		}
	}
	if !slices.Equal(f.LibDirs(), []string{lib}) {
		t.Errorf("LibDirs = %v", f.LibDirs())
	}
}

// Installed finds a driver kept only in a directory the root's ld.so.conf
// lists, as Find does; the distributions' directories alone would not.
func TestInstalled(t *testing.T) {
	root := tree(t, map[string]string{
		"/etc/ld.so.conf":                        "/opt/nvidia/lib\n",
		"/opt/nvidia/lib/libnvidia-ml.so." + ver: "",
	})
	if v, ok, err := driver.Installed(root); !ok || err != nil || v.Version != ver {
		t.Errorf("Installed = %+v, %v, %v; want %s", v, ok, err, ver)
	}
}
