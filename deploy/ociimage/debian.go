package ociimage

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// debianSkip are package paths an image does not need.
var debianSkip = []string{"/usr/lib/x86_64-linux-gnu/gconv/", "/usr/share/doc/", "/usr/share/lintian/", "/usr/share/locale/", "/usr/share/man/", "/usr/share/info/"}

// AddDebianPackage adds the files of the installed Debian package pkg, as
// `dpkg -L` lists them (regular files and symlinks; documentation skipped),
// and returns an error naming the fix when it is not installed.
func (img *Image) AddDebianPackage(pkg string) error {
	out, err := exec.Command("dpkg-query", "-L", pkg).Output()
	if err != nil {
		return fmt.Errorf("list the files of Debian package %s (dpkg-query -L): %w; install it with apt-get install %s", pkg, err, pkg)
	}
	for _, p := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if p == "" || p == "/." || skipDebian(p) {
			continue
		}
		st, err := os.Lstat(p)
		if err != nil {
			// dpkg lists diversions and files a later package replaced.
			continue
		}
		// On a merged-/usr host /lib is a link to usr/lib: the image keeps
		// that link and holds the file at its real path below it.
		dst := p
		if dir, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
			dst = filepath.Join(dir, filepath.Base(p))
		}
		switch {
		case st.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("package %s: %w", pkg, err)
			}
			img.AddSymlink(dst, target)
		case st.Mode().IsRegular():
			if err := img.AddFile(p, dst); err != nil {
				return fmt.Errorf("package %s: %w", pkg, err)
			}
		}
	}
	return nil
}

func skipDebian(p string) bool {
	for _, s := range debianSkip {
		if strings.HasPrefix(p, s) {
			return true
		}
	}
	return false
}
