package cachebuild

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A script run by Run finds the library where it sources it from in the
// repository.
func TestRunProvidesTheLibrary(t *testing.T) {
	script := []byte(`set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../internal/cachebuild/debian-mirrors.sh"
declare -F host_debian_mirrors >/dev/null
echo sourced
`)
	got, err := Run(context.Background(), script, "test script", nil)
	if err != nil || got != "sourced" {
		t.Fatalf("Run = %q, %v; want the library sourced", got, err)
	}
}

// host_debian_mirrors lists the deb URIs of the host's codename from
// one-line and deb822 apt sources, in apt's file order, once each.
func TestHostDebianMirrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		codename string
		files    map[string]string // under etc/apt
		want     []string
	}{
		{"deb822 and one-line", "bookworm", map[string]string{
			"sources.list.d/debian.sources": `# comment
Types: deb deb-src
URIs: http://m1.example/debian http://m2.example/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security

Types: deb
Enabled: no
URIs: http://disabled.example/debian
Suites: bookworm
`,
			// .list files come before .sources, as the scripts always read them.
			"sources.list.d/extra.list": "deb [arch=amd64] http://list.example/debian bookworm main # c\n",
		}, []string{"http://list.example/debian", "http://m1.example/debian", "http://m2.example/debian"}},
		{"one-line only: comments, deb-src and other suites left out", "bookworm", map[string]string{
			"sources.list": "deb http://a.example/debian bookworm main\ndeb http://a.example/debian bookworm contrib\n" +
				"# deb http://c.example/debian bookworm main\ndeb-src http://s.example/debian bookworm main\ndeb http://b.example/debian trixie main\n",
		}, []string{"http://a.example/debian"}},
		{"keys in any case, a URI in two files once", "bookworm", map[string]string{
			"sources.list":             "deb http://dup.example/debian bookworm main\n",
			"sources.list.d/z.sources": "types: deb\nuris:\thttp://dup.example/debian  http://z.example/debian\nSUITES: bookworm\n",
		}, []string{"http://dup.example/debian", "http://z.example/debian"}},
		{"no codename", "", map[string]string{"sources.list": "deb http://x.example/debian bookworm main\n"}, nil},
		{"no entry for the codename", "trixie", map[string]string{
			"sources.list.d/d.sources": "Types: deb\nURIs: http://t.example/debian\nSuites: bookworm\n",
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			release := "ID=debian\n"
			if tc.codename != "" {
				release += "VERSION_CODENAME=" + tc.codename + "\n"
			}
			files := map[string]string{"os-release": release}
			for p, c := range tc.files {
				files["apt/"+p] = c
			}
			for p, c := range files {
				p = filepath.Join(root, "etc", p)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			out, err := exec.Command("bash", "-c", `set -euo pipefail; source "$1"; host_debian_mirrors "$2"`, "bash", "debian-mirrors.sh", root).Output()
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Fields(string(out)); strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("mirrors %q, want %q", got, tc.want)
			}
		})
	}
}
