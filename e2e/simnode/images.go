package simnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nvinject/nvinject/e2e/ociimage"
)

// imageSpec is one image the deployment needs: a program from the bin dir at
// /usr/bin/<name>, plus its ldd libraries (cgo programs need glibc), and
// more programs from the bin dir beside it.
type imageSpec struct {
	ref, program string
	more         []string
}

var nvinjectImages = []imageSpec{
	// The device plugin's init container installs nvinject-cdi-hook on the node.
	{DevicePluginImage, "nvinject-device-plugin", []string{"nvinject-cdi-hook"}},
	{NRIImage, "nvinject-nri", nil},
	{VLLMImage, "vllm-standin", nil},
}

// busyboxApplets are linked in the busybox image for test pods.
var busyboxApplets = []string{"sh", "sleep", "ls", "cat", "env", "grep"}

// ImportImages packs the nvinject, vLLM stand-in and busybox images as OCI
// archives under <run dir>/nvinject-images and imports them into the node's
// containerd (there is no registry).
func (d *Deployer) ImportImages(ctx context.Context) error {
	dir := filepath.Join(d.node.RunDir(), "nvinject-images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create image dir %s: %w", dir, err)
	}
	imgs := map[string]*ociimage.Image{}
	for _, s := range nvinjectImages {
		img := ociimage.New(s.ref, ociimage.WithEntrypoint("/usr/bin/"+s.program))
		for _, p := range append([]string{s.program}, s.more...) {
			if err := img.AddBinary(filepath.Join(d.bin, p), "/usr/bin/"+p); err != nil {
				return fmt.Errorf("image %s: %w; run `make build` first", s.ref, err)
			}
		}
		imgs[s.ref] = img
	}
	bb := ociimage.New(BusyboxImage, ociimage.WithEntrypoint("/bin/sh"))
	if err := bb.AddFile("/bin/busybox", "/bin/busybox"); err != nil {
		return fmt.Errorf("busybox image: %w; apt-get install busybox-static", err)
	}
	for _, a := range busyboxApplets {
		bb.AddSymlink("/bin/"+a, "busybox")
	}
	imgs[BusyboxImage] = bb
	for ref, img := range imgs {
		archive := filepath.Join(dir, archiveName(ref))
		if err := img.WriteArchiveFile(archive); err != nil {
			return fmt.Errorf("write image archive %s: %w", archive, err)
		}
		if err := d.node.ImportImage(ctx, archive); err != nil {
			return err
		}
	}
	return nil
}

func archiveName(ref string) string {
	return strings.NewReplacer("/", "_", ":", "_").Replace(ref) + ".tar"
}
