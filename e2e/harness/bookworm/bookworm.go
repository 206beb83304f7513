// Package bookworm gives tests a minimal Debian bookworm root filesystem (glibc,
// ldconfig, coreutils, bash, apt), built with mmdebstrap by build.sh in this directory
// and cached machine-wide as a tar: the base of workload images and chroots that load
// NVIDIA's real driver libraries, which need glibc. Building needs root.
//
// With deploy/ociimage, ociimage.New(ref, ociimage.WithBaseLayer(tar)) makes an image of it;
// Unpack makes a chroot of it with other trees (a driver root, a probe) copied in.
package bookworm

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"os/exec"

	"github.com/nvinject/nvinject/e2e/internal/cachebuild"
)

//go:embed build.sh
var script []byte

// ErrUnavailable is matched (errors.Is) by Rootfs's error when Debian's archive cannot
// be reached and no rootfs is cached.
var ErrUnavailable = cachebuild.ErrUnavailable

// Rootfs returns the path of the bookworm rootfs tar, building it the first time (about
// two minutes; instant once cached).
func Rootfs(ctx context.Context) (string, error) {
	tarball, err := cachebuild.Run(ctx, script, "build the bookworm rootfs (e2e/harness/bookworm/build.sh)", nil)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(tarball); err != nil {
		return "", fmt.Errorf("e2e/harness/bookworm/build.sh printed %q: %w", tarball, err)
	}
	return tarball, nil
}

// Unpack extracts the rootfs tar into dir (empty or missing), copies each tree over it
// and runs ldconfig inside, so dir is a chroot whose `ldconfig -p` lists the trees'
// libraries. The base's directory symlinks (/lib -> usr/lib) are kept, and a tree's
// etc/ld.so.conf and etc/ld.so.cache (a driver root's own) are skipped: the base's
// configuration already lists /usr/lib/x86_64-linux-gnu. Needs root.
func Unpack(ctx context.Context, rootfs, dir string, trees ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "tar", "-C", dir, "-xf", rootfs).CombinedOutput(); err != nil {
		return fmt.Errorf("unpack %s: %w: %s", rootfs, err, out)
	}
	for _, tree := range trees {
		sh := `tar -C "$1" --exclude=./etc/ld.so.conf --exclude=./etc/ld.so.cache -c . | tar -C "$2" -x --keep-directory-symlink`
		if out, err := exec.CommandContext(ctx, "sh", "-ec", sh, "sh", tree, dir).CombinedOutput(); err != nil {
			return fmt.Errorf("copy %s into %s: %w: %s", tree, dir, err, out)
		}
	}
	if out, err := exec.CommandContext(ctx, "chroot", dir, "/usr/sbin/ldconfig").CombinedOutput(); err != nil {
		return fmt.Errorf("ldconfig in %s: %w: %s", dir, err, out)
	}
	return nil
}
