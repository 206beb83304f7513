package ldcache

import (
	"debug/elf"
	"math/rand/v2"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/cdi/ldcache/ldcachetest"
)

func TestLibcmp(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"libfoo.so.10", "libfoo.so.9", 1},
		{"libfoo.so.1.2.10", "libfoo.so.1.2.9", 1},
		{"libfoo.so.01", "libfoo.so.1", 0},
		{"libfoo.so", "libfoo.so.1", -1},
		{"libfoo.so.1", "libfoo.so.a", 1}, // a digit above any other byte
		{"libfoo", "libfoo\xe9", 1},       // a high byte is a negative char
		{"libfoo\xe9", "libfoo", -1},      // and sorts below the end
		{"libA.so", "liba.so", -1},
		{"libc.so.6", "libc.so.6", 0},
		{"", "", 0},
	} {
		if got := Libcmp(tc.a, tc.b); got != tc.want {
			t.Errorf("Libcmp(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestIndexable(t *testing.T) {
	for name, want := range map[string]bool{
		"libcuda.so.1": true, "libx.so.123456789": true, "libx.so.1234567890": false,
		"": false, "..": false, "a/b": false, "a\x00": false, strings.Repeat("l", 256): false,
	} {
		if got := Indexable(name); got != want {
			t.Errorf("Indexable(%q) = %v, want %v", name, got, want)
		}
	}
}

// glibc's ldconfig is the reference for the order: it writes a root's
// cache, and Sort puts the same entries, given in directory order, in the
// same order.
func TestSortMatchesLDConfig(t *testing.T) {
	ldconfig, err := exec.LookPath("/sbin/ldconfig")
	if err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and /sbin/ldconfig")
	}
	root := t.TempDir()
	dirs := []string{"/d1", "/d2", "/d3"}
	write := func(p string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/ld.so.conf", []byte(strings.Join(dirs, "\n")+"\n"))
	names := []string{"libcuda.so.1", "libcuda.so.10", "libcuda.so.9", "libcuda.so", "libc.so.6", "libA.so.1", "liba.so.1",
		"libz.so.1", "libz-ng.so.2", "libx.so.1.2.10", "libx.so.1.2.9", "libx.so.01.5", "ld-linux-x86-64.so.2", "libnvidia-ml.so.1",
		"libnvidia-ml.so.535.261.03", "libstdc++.so.6", "lib_.so.7", "lib.so.3", "libq\xc3\xa9.so.1"}
	for i, n := range names {
		d := dirs[i%len(dirs)]
		write(path.Join(d, n+".file"), ldcachetest.DSO{SOName: n}.Bytes())
		// The same soname again in the next directory: the first listed wins.
		if i%4 == 0 {
			write(path.Join(dirs[(i+1)%len(dirs)], n+".again"), ldcachetest.DSO{SOName: n}.Bytes())
		}
		// And as a 32-bit library: same name, other flags.
		if i%5 == 0 {
			write(path.Join(d, n+".i386"), ldcachetest.DSO{SOName: n + "", Machine: elf.EM_386, Class: elf.ELFCLASS32, Needed: []string{"libc.so.6"}}.Bytes())
		}
		if i%3 == 0 {
			write(path.Join(d, "glibc-hwcaps/x86-64-v3", n+".v3"), ldcachetest.DSO{SOName: n}.Bytes())
			write(path.Join(d, "glibc-hwcaps/x86-64-v2", n+".v2"), ldcachetest.DSO{SOName: n}.Bytes())
		}
	}
	cache := filepath.Join(root, "etc/ld.so.cache")
	if out, err := exec.Command(ldconfig, "-X", "-r", root).CombinedOutput(); err != nil {
		t.Fatalf("ldconfig: %v\n%s", err, out)
	}
	data, err := os.ReadFile(cache)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if n, h := len(want), slices.IndexFunc(want, func(e Entry) bool { return e.HWCaps != "" }); n < len(names)*2 || h < 0 {
		t.Fatalf("ldconfig indexed %d entries of the root", n)
	}
	// Directory order (d1, its hwcaps dirs, d2, ...), shuffled within a
	// directory, is what a builder has before sorting.
	rank := func(e Entry) string {
		dir := path.Dir(e.Path)
		if e.HWCaps != "" {
			dir = path.Dir(path.Dir(dir))
		}
		return dir
	}
	in := slices.Clone(want)
	rand.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
	slices.SortStableFunc(in, func(a, b Entry) int { return strings.Compare(rank(a), rank(b)) })
	Sort(in)
	if !slices.Equal(in, want) {
		for i := range want {
			if in[i] != want[i] {
				t.Errorf("entry %d: Sort gives %+v, ldconfig wrote %+v", i, in[i], want[i])
			}
		}
	}
}

// What Marshal writes, hwcaps extension and generator included, is read
// back by Parse and by glibc's own ldconfig -p.
func TestMarshalReadByLDConfig(t *testing.T) {
	entries := []Entry{
		{Flags: FlagELFLibc6 | FlagX8664, Name: "libcuda.so.1", Path: "/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libcuda.so.1", HWCaps: "x86-64-v3"},
		{Flags: FlagELFLibc6 | FlagX8664, Name: "libcuda.so.1", Path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
		{Flags: FlagELFLibc6, Name: "libcuda.so.1", Path: "/usr/lib/i386-linux-gnu/libcuda.so.1"},
		{Flags: FlagELFLibc6 | FlagX8664, Name: "libc.so.6", Path: "/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v2/libc.so.6", HWCaps: "x86-64-v2"},
		{Flags: FlagELFLibc6 | FlagX8664, Name: "libc.so.6", Path: "/lib/x86_64-linux-gnu/libc.so.6"},
	}
	Sort(entries)
	data := MarshalGenerated(entries, "nvinject-cdi-hook test")
	got, err := Parse(data)
	if err != nil || !slices.Equal(got, entries) {
		t.Fatalf("Parse = %+v, %v; want %+v", got, err, entries)
	}
	ldconfig, err := exec.LookPath("/sbin/ldconfig")
	if err != nil {
		t.Skip("no /sbin/ldconfig")
	}
	file := filepath.Join(t.TempDir(), "ld.so.cache")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(ldconfig, "-p", "-C", file).CombinedOutput()
	if err != nil {
		t.Fatalf("ldconfig -p: %v\n%s", err, out)
	}
	for _, want := range []string{
		"5 libs found in cache",
		"libcuda.so.1 (libc6,x86-64, hwcap: \"x86-64-v3\") => /usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libcuda.so.1",
		"libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1",
		"libcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1",
		"libc.so.6 (libc6,x86-64, hwcap: \"x86-64-v2\") => /lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v2/libc.so.6",
		"Cache generated by: nvinject-cdi-hook test",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("ldconfig -p lacks %q:\n%s", want, out)
		}
	}
}
