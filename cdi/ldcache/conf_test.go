package ldcache

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s), Mode: 0o644} }

func TestConfDirs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files fstest.MapFS
		want  []string
	}{
		{"no ld.so.conf", fstest.MapFS{}, nil},
		{"debian", fstest.MapFS{
			"etc/ld.so.conf":                           file("include /etc/ld.so.conf.d/*.conf\n"),
			"etc/ld.so.conf.d/libc.conf":               file("# libc default configuration\n/usr/local/lib\n"),
			"etc/ld.so.conf.d/x86_64-linux-gnu.conf":   file("# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n"),
			"etc/ld.so.conf.d/.hidden.conf":            file("/hidden\n"),
			"etc/ld.so.conf.d/skip.txt":                file("/skip\n"),
			"etc/ld.so.conf.d/00-nvinject-driver.conf": file("/usr/lib/x86_64-linux-gnu/nvidia/current\n"),
		}, []string{"/usr/lib/x86_64-linux-gnu/nvidia/current", "/usr/local/lib", "/usr/local/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"}},
		{"comments, blanks, types, trailing slashes, duplicates", fstest.MapFS{
			"etc/ld.so.conf": file("  /a//  # comment\n\t\n/b=libc6\n/a\n#/c\n/d/../e/\n/\nhwcap 1 nosegneg\nHWCAP\t0 x\n/f\x00/g\n/h i\n"),
		}, []string{"/a", "/b", "/e", "/f", "/h i"}},
		{"option-looking and relative lines are no directories", fstest.MapFS{
			"etc/ld.so.conf": file("-r /host -X -C /victim\n-f\nrelative/dir\n--\n/ok\n"),
		}, []string{"/ok"}},
		{"relative include, nested, several patterns, sorted", fstest.MapFS{
			"etc/ld.so.conf":       file("include conf.d/*.conf other.conf\n/last\n"),
			"etc/conf.d/b.conf":    file("/b\ninclude ../nested/x.conf\n"),
			"etc/conf.d/a.conf":    file("/a\n"),
			"etc/nested/x.conf":    file("/x\n"),
			"etc/other.conf":       file("/other\n"),
			"etc/conf.d/c.conf.no": file("/no\n"),
		}, []string{"/a", "/b", "/x", "/other", "/last"}},
		{"glob classes and directories", fstest.MapFS{
			"etc/ld.so.conf":    file("include /etc/d[!x]/[ab]?.conf /etc/dx/*.conf\n"),
			"etc/dy/a1.conf":    file("/dy-a1\n"),
			"etc/dy/c1.conf":    file("/dy-c1\n"),
			"etc/dz/b2.conf":    file("/dz-b2\n"),
			"etc/dx/a1.conf":    file("/dx-a1\n"),
			"etc/d-/a1.conf":    file("/d--a1\n"),
			"etc/d/a1.conf/sub": file("/dir-not-file\n"),
		}, []string{"/d--a1", "/dy-a1", "/dz-b2", "/dx-a1"}},
		{"include without pattern, missing and unreadable files", fstest.MapFS{
			"etc/ld.so.conf": file("include\ninclude \t \ninclude /nonexistent/*.conf /etc/missing.conf /etc\n/ok\n"),
		}, []string{"/ok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ConfDirs(tc.files)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("ConfDirs = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestConfDirsLimits(t *testing.T) {
	many := fstest.MapFS{"etc/ld.so.conf": file("include /etc/d/*\n")}
	for i := range MaxConfFiles + 1 {
		many[fmt.Sprintf("etc/d/%04d", i)] = file("/x\n")
	}
	var dirs strings.Builder
	for i := range MaxConfDirs + 1 {
		fmt.Fprintf(&dirs, "/d%d\n", i)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"include loop":   {"etc/ld.so.conf": file("include /etc/ld.so.conf\n")},
		"mutual loop":    {"etc/ld.so.conf": file("include /etc/a\n"), "etc/a": file("include /etc/ld.so.conf\n")},
		"too large":      {"etc/ld.so.conf": file(strings.Repeat("#", MaxConfSize+1))},
		"too many files": many,
		"too many dirs":  {"etc/ld.so.conf": file(dirs.String())},
	} {
		got, err := ConfDirs(fsys)
		if !errors.Is(err, ErrConfLimit) || got != nil {
			t.Errorf("%s: ConfDirs = %d dirs, %v; want ErrConfLimit", name, len(got), err)
		}
		if err != nil && len(err.Error()) > 200 {
			t.Errorf("%s: error of %d bytes is not bounded", name, len(err.Error()))
		}
	}
}

// glibc's own ldconfig is the reference: run with -r on a root holding
// the same configuration, it lists (-v) the directories it reads, in its
// order; ConfDirs must list the same ones in the same order.
func TestConfDirsMatchesLDConfig(t *testing.T) {
	ldconfig, err := exec.LookPath("/sbin/ldconfig")
	if err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and /sbin/ldconfig")
	}
	root := t.TempDir()
	files := map[string]string{
		"etc/ld.so.conf":           "include /etc/ld.so.conf.d/*.conf\n/top//\n/b=libc6\ninclude /etc/extra/[!x]*.conf\n",
		"etc/ld.so.conf.d/a.conf":  "/a\n  /c  # trailing\n/top\n",
		"etc/ld.so.conf.d/.h.conf": "/hidden\n",
		"etc/ld.so.conf.d/b.conf":  "include /etc/nested.conf\nhwcap 0 x\n/b\n",
		"etc/nested.conf":          "/n\n",
		"etc/extra/y.conf":         "/y\n",
		"etc/extra/x.conf":         "/x\n",
	}
	for name, data := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"a", "b", "c", "top", "hidden", "n", "x", "y"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(ldconfig, "-v", "-N", "-X", "-r", root).CombinedOutput()
	if err != nil {
		t.Fatalf("ldconfig: %v\n%s", err, out)
	}
	var want []string
	for _, m := range regexp.MustCompile(`(?m)^(/\S*): \(from (\S+):\d+\)$`).FindAllStringSubmatch(string(out), -1) {
		if m[2] != "<builtin>" {
			want = append(want, m[1])
		}
	}
	if len(want) < 6 {
		t.Fatalf("ldconfig -v listed %q; the output format changed?\n%s", want, out)
	}
	got, err := ConfDirs(os.DirFS(root))
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("ConfDirs = %q, %v; glibc's ldconfig read %q\n%s", got, err, want, out)
	}
}

// An image's or a driver root's loader configuration is hostile input:
// whatever it holds, ConfDirs gives absolute, clean, distinct directories
// within the limits, or ErrConfLimit.
func FuzzConfDirs(f *testing.F) {
	f.Add("include /etc/ld.so.conf.d/*.conf\n/usr/lib\n", "/opt/lib\ninclude ../x\n")
	f.Add("-r /proc/1/root -X -C /victim\n", "/proc/1/root/etc\n")
	f.Add("include a b\n/a/../../b//\n", "include /etc/ld.so.conf\n")
	f.Fuzz(func(t *testing.T, conf, dropin string) {
		fsys := fstest.MapFS{
			"etc/ld.so.conf":          file(conf),
			"etc/ld.so.conf.d/a.conf": file(dropin),
			"etc/a":                   file(dropin),
			"etc/b":                   file(conf),
		}
		dirs, err := ConfDirs(fsys)
		if err != nil {
			if !errors.Is(err, ErrConfLimit) {
				t.Fatalf("ConfDirs: %v", err)
			}
			return
		}
		seen := map[string]bool{}
		for _, d := range dirs {
			if !filepath.IsAbs(d) || filepath.Clean(d) != d || seen[d] {
				t.Fatalf("ConfDirs gave %q in %q", d, dirs)
			}
			seen[d] = true
		}
	})
}
