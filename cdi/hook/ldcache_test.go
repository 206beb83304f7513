package hook_test

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvinject/nvinject/cdi/hook"
	"github.com/nvinject/nvinject/cdi/ldcache"
	"github.com/nvinject/nvinject/cdi/ldcache/ldcachetest"
	"github.com/nvinject/nvinject/shared/driverroot/driverroottest"
)

// tree writes files (path -> content; content "->X" makes a symlink to X)
// under root.
func tree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, data := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if target, ok := strings.CutPrefix(data, "->"); ok {
			err = os.Symlink(target, full)
		} else {
			err = os.WriteFile(full, []byte(data), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func dso(soname string) string { return string(ldcachetest.DSO{SOName: soname}.Bytes()) }

// ldconfigCache runs glibc's ldconfig -X -r on a copy of root with folders
// first on its command line (as update-ldcache puts them first) and
// returns the entries of the cache it wrote.
func ldconfigCache(t *testing.T, root string, folders []string) []ldcache.Entry {
	t.Helper()
	ldconfig, err := exec.LookPath("/sbin/ldconfig")
	if err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and /sbin/ldconfig, the reference")
	}
	cp := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", root, cp).CombinedOutput(); err != nil {
		t.Fatalf("copy the root: %v\n%s", err, out)
	}
	if out, err := exec.Command(ldconfig, append([]string{"-X", "-r", cp}, folders...)...).CombinedOutput(); err != nil {
		t.Fatalf("ldconfig: %v\n%s", err, out)
	}
	data, err := os.ReadFile(filepath.Join(cp, "etc/ld.so.cache"))
	if err != nil {
		t.Fatal(err)
	}
	entries, err := ldcache.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

func sameEntries(t *testing.T, got, want []ldcache.Entry) {
	t.Helper()
	if slices.Equal(got, want) {
		return
	}
	t.Errorf("update-ldcache wrote %d entries, glibc's ldconfig %d:", len(got), len(want))
	for i := range max(len(got), len(want)) {
		var g, w ldcache.Entry
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Errorf("  %d: hook %+v\n     ldconfig %+v", i, g, w)
		}
	}
}

// update-ldcache writes the cache glibc's ldconfig writes for the same
// root, entry for entry and in the same order: sonames, development links,
// a file beating a link, the newest version winning, files without
// DT_SONAME, 32-bit libraries, merged /usr reached twice, glibc-hwcaps
// subdirectories, ld.so.conf includes; and what ldconfig skips (scripts
// named like libraries, other machines, dangling links) it skips too.
func TestUpdateLDCacheMatchesLDConfig(t *testing.T) {
	root := t.TempDir()
	i386 := string(ldcachetest.DSO{SOName: "libfoo.so.1", Machine: elf.EM_386, Class: elf.ELFCLASS32, Needed: []string{"libc.so.6"}}.Bytes())
	tree(t, root, map[string]string{
		"etc/ld.so.conf":          "include /etc/ld.so.conf.d/*.conf\n/opt/extra\n",
		"etc/ld.so.conf.d/a.conf": "/usr/local/lib\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n/missing\n",
		"lib":                     "->usr/lib",
		"usr/lib/x86_64-linux-gnu/libfoo.so.1.2.3":                         dso("libfoo.so.1"),
		"usr/lib/x86_64-linux-gnu/libfoo.so.1.2.10":                        dso("libfoo.so.1"),
		"usr/lib/x86_64-linux-gnu/libfoo.so.1":                             "->libfoo.so.1.2.10",
		"usr/lib/x86_64-linux-gnu/libfoo.so":                               "->libfoo.so.1",
		"usr/lib/x86_64-linux-gnu/libbar.so.2":                             dso("libbar.so.2"),
		"usr/lib/x86_64-linux-gnu/libbar.so":                               "->libbar.so.2",
		"usr/lib/x86_64-linux-gnu/libnosoname.so.3":                        dso(""),
		"usr/lib/x86_64-linux-gnu/libc.so":                                 "/* GNU ld script */ GROUP ( libc.so.6 )\n",
		"usr/lib/x86_64-linux-gnu/libriscv.so.1":                           string(ldcachetest.DSO{SOName: "libriscv.so.1", Machine: elf.EM_RISCV}.Bytes()),
		"usr/lib/x86_64-linux-gnu/libgone.so.1":                            "->libgone.so.1.0",
		"usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2":                    dso("ld-linux-x86-64.so.2"),
		"usr/lib/x86_64-linux-gnu/notalib.so.1":                            dso("notalib.so.1"),
		"usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libfoo.so.1.2.10": dso("libfoo.so.1"),
		"usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libfoo.so.1":      "->libfoo.so.1.2.10",
		"usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v2/libbar.so.2":      dso("libbar.so.2"),
		"usr/lib/i386-linux-gnu/libfoo.so.1":                               i386,
		"usr/local/lib/libfoo.so.1":                                        dso("libfoo.so.1"),
		"usr/local/lib/liblinkonly.so.5":                                   "->../../lib/x86_64-linux-gnu/libbar.so.2",
		"usr/local/lib/libbar.so.2":                                        "->liblinkonly.so.5",
		"opt/extra/libextra.so.7":                                          dso("libextra.so.7"),
		"opt/driver/libcuda.so.535.261.03":                                 dso("libcuda.so.1"),
		"opt/driver/libcuda.so.1":                                          "->libcuda.so.535.261.03",
		"opt/driver/libcuda.so":                                            "->libcuda.so.1",
	})
	if err := os.WriteFile(filepath.Join(root, "etc/ld.so.conf.d/b.conf"), []byte("/usr/lib/i386-linux-gnu\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	folders := []string{"/opt/driver"}
	got, err := hook.UpdateLDCache(openRoot(t, root), folders)
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, got, ldconfigCache(t, root, folders))
	onDisk, err := os.ReadFile(filepath.Join(root, "etc/ld.so.cache"))
	if err != nil {
		t.Fatal(err)
	}
	if parsed, err := ldcache.Parse(onDisk); err != nil || !slices.Equal(parsed, got) {
		t.Errorf("the cache file holds %+v, %v; UpdateLDCache returned %+v", parsed, err, got)
	}
}

// overlay mounts an overlay of lower with its own upper directory, so a
// shared driver root can be written to without changing it.
func overlay(t testing.TB, lower string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for an overlay mount")
	}
	dir := t.TempDir()
	merged := filepath.Join(dir, "merged")
	for _, d := range []string{"upper", "work", "merged"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Skipf("overlay mount: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })
	return merged
}

// On NVIDIA's REAL driver user space (both layouts; Debian's reaches every
// public name through /etc/alternatives with absolute links), the cache
// equals glibc's ldconfig's.
func TestUpdateLDCacheMatchesLDConfigRealDriver(t *testing.T) {
	for _, layout := range driverroottest.Layouts {
		t.Run(layout, func(t *testing.T) {
			root := overlay(t, driverroottest.Root(t, layout))
			folders := []string{"/usr/lib/x86_64-linux-gnu"}
			if layout == "debian" {
				folders = append(folders, "/usr/lib/x86_64-linux-gnu/nvidia/current")
			}
			got, err := hook.UpdateLDCache(openRoot(t, root), folders)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(got, func(e ldcache.Entry) bool { return e.Name == "libcuda.so.1" }) {
				t.Errorf("no libcuda.so.1 among %d entries", len(got))
			}
			sameEntries(t, got, ldconfigCache(t, root, folders))
		})
	}
}

// A library without its soname link (ldconfig would make one) is
// recorded by its own file, which the loader opens just as well; the hook
// writes nothing but the cache and its two drop-ins.
func TestUpdateLDCacheMakesNoLinks(t *testing.T) {
	root := t.TempDir()
	tree(t, root, map[string]string{"opt/driver/libz.so.1.2.13": dso("libz.so.1")})
	got, err := hook.UpdateLDCache(openRoot(t, root), []string{"/opt/driver/"})
	if err != nil {
		t.Fatal(err)
	}
	want := []ldcache.Entry{{Flags: ldcache.FlagELFLibc6 | ldcache.FlagX8664, Name: "libz.so.1", Path: "/opt/driver/libz.so.1.2.13"}}
	if !slices.Equal(got, want) {
		t.Errorf("entries %+v, want %+v", got, want)
	}
	var files []string
	_ = filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			files = append(files, strings.TrimPrefix(p, root))
		}
		return nil
	})
	slices.Sort(files)
	if w := []string{"/etc/ld.so.cache", "/etc/ld.so.conf", hook.DriverConf, "/opt/driver/libz.so.1.2.13"}; !slices.Equal(files, w) {
		t.Errorf("files in the root: %q, want %q", files, w)
	}
	if conf, err := os.ReadFile(filepath.Join(root, hook.DriverConf)); err != nil || string(conf) != "/opt/driver\n" {
		t.Errorf("%s = %q, %v", hook.DriverConf, conf, err)
	}
	if _, err := hook.UpdateLDCache(openRoot(t, root), []string{"relative"}); err == nil {
		t.Error("a relative folder was accepted")
	}
}

// The CUDA compat directory enable-cuda-compat listed comes first: its
// libcuda.so.1 wins over the driver's.
func TestUpdateLDCacheCompatFirst(t *testing.T) {
	root := t.TempDir()
	tree(t, root, map[string]string{
		"usr/local/cuda/compat/libcuda.so.580.95.05": dso("libcuda.so.1"),
		"usr/local/cuda/compat/libcuda.so.1":         "->libcuda.so.580.95.05",
		"opt/driver/libcuda.so.535.261.03":           dso("libcuda.so.1"),
		"opt/driver/libcuda.so.1":                    "->libcuda.so.535.261.03",
	})
	r := openRoot(t, root)
	if on, err := hook.EnableCUDACompat(r, "535.261.03", "/usr/local/cuda/compat"); !on || err != nil {
		t.Fatalf("EnableCUDACompat = %v, %v", on, err)
	}
	got, err := hook.UpdateLDCache(r, []string{"/opt/driver"})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range got {
		if e.Name == "libcuda.so.1" {
			paths = append(paths, e.Path)
		}
	}
	if want := []string{"/usr/local/cuda/compat/libcuda.so.1", "/opt/driver/libcuda.so.1"}; !slices.Equal(paths, want) {
		t.Errorf("libcuda.so.1 entries %q, want %q (compat first)", paths, want)
	}
}

// What an image puts in a library directory that is no library, or no
// file, is never opened: a FIFO would block the hook, a device node would
// run its driver's open as root.
func TestUpdateLDCacheOpensOnlyFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	root := t.TempDir()
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	tree(t, root, map[string]string{"usr/lib/x86_64-linux-gnu/libok.so.1": dso("libok.so.1"), "usr/lib/x86_64-linux-gnu/libnull.so.1": "->/dev/null"})
	if err := unix.Mkfifo(filepath.Join(lib, "libfifo.so.1"), 0o644); err != nil {
		t.Fatal(err)
	}
	// /dev/full's numbers: were it opened, ReadFile would read its zeros;
	// it must fail as not a regular file, unopened.
	if err := unix.Mknod(filepath.Join(lib, "libdev.so.1"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 7))); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(root, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	r := openRoot(t, root)
	got, err := hook.UpdateLDCache(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != "libok.so.1" {
		t.Errorf("entries %+v, want libok.so.1 alone", got)
	}
	for _, p := range []string{"usr/lib/x86_64-linux-gnu/libfifo.so.1", "usr/lib/x86_64-linux-gnu/libdev.so.1", "usr/lib/x86_64-linux-gnu/libnull.so.1"} {
		if _, err := r.ReadFile(p, 10); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("ReadFile(%s) = %v, want not a regular file", p, err)
		}
		if f, err := r.Open(p); err == nil {
			f.Close()
			t.Errorf("Open(%s) opened a special file", p)
		}
	}
}

// BenchmarkUpdateLDCache writes the cache of NVIDIA's real driver root
// (Debian layout, both driver folders) in Go; BenchmarkAnchorLDConfig is
// glibc's ldconfig -X -r on the same root and folders, what update-ldcache
// ran before (without its fork and exec of the hook's own ldconfig wrapper).
func BenchmarkUpdateLDCache(b *testing.B) {
	root := overlay(b, driverroottest.Root(b, "debian"))
	r, err := hook.OpenRoot(root)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	for b.Loop() {
		if _, err := hook.UpdateLDCache(r, benchFolders); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAnchorLDConfig(b *testing.B) {
	root := overlay(b, driverroottest.Root(b, "debian"))
	for b.Loop() {
		if out, err := exec.Command("/sbin/ldconfig", append([]string{"-X", "-r", root}, benchFolders...)...).CombinedOutput(); err != nil {
			b.Fatalf("ldconfig: %v\n%s", err, out)
		}
	}
}

var benchFolders = []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu/nvidia/current"}
