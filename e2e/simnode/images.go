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
// /usr/bin/<name>, plus its ldd libraries (cgo programs need glibc).
type imageSpec struct {
	ref, program string
}

var nvinjectImages = []imageSpec{
	{VLLMImage, "vllm-standin"},
}

// releaseArchives are the daemons' release images that `make images` writes
// under _out/images: the node runs exactly what is shipped.
var releaseArchives = []string{"nvinject-device-plugin.oci.tar", "nvinject-nri.oci.tar"}

// busyboxApplets are linked in the busybox image for test pods.
var busyboxApplets = []string{"sh", "sleep", "ls", "cat", "env", "grep"}

// ImportImages imports the daemons' release images (`make images`) and packs
// the vLLM stand-in and busybox test images as OCI archives under
// <run dir>/nvinject-images, importing them into the node's containerd
// (there is no registry).
func (d *Deployer) ImportImages(ctx context.Context) error {
	for _, a := range releaseArchives {
		archive := filepath.Join(d.repo, "_out", "images", a)
		if _, err := os.Stat(archive); err != nil {
			return fmt.Errorf("release image %s: %w; run `make images`", archive, err)
		}
		if err := d.node.ImportImage(ctx, archive); err != nil {
			return err
		}
	}
	dir := filepath.Join(d.node.RunDir(), "nvinject-images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create image dir %s: %w", dir, err)
	}
	imgs := map[string]*ociimage.Image{}
	for _, s := range nvinjectImages {
		bin := filepath.Join(d.bin, s.program)
		img := ociimage.New(s.ref, ociimage.WithEntrypoint("/usr/bin/"+s.program))
		if err := img.AddBinary(bin, "/usr/bin/"+s.program); err != nil {
			return fmt.Errorf("image %s: %w; run `make build` first", s.ref, err)
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
