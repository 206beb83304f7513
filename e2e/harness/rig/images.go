package rig

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nvinject/nvinject/deploy/ociimage"
	"github.com/nvinject/nvinject/e2e/harness/bookworm"
)

// SimImagesDir (under the repository) holds the daemons' images that `make
// sim-images` writes: the release images' base, files and labels with each
// program's SIMULATION build, so the node runs the shipped code paths on
// simulated GPUs (the device plugin's image carries nvinject-cdi-hook for
// its init container).
const SimImagesDir = "_out/equipment/images"

// EquipmentDir (under the repository) holds the SIMULATION builds of the
// shipped programs and the test and demo equipment (`make equipment`).
const EquipmentDir = "_out/equipment"

// releaseArchives are the daemons' images in SimImagesDir the node runs.
var releaseArchives = []string{"nvinject-device-plugin.oci.tar", "nvinject-nri.oci.tar"}

// busyboxApplets are linked in the busybox image for test pods; the image
// also carries nvidia-smi-sim (static), the SIMULATED GPUs' UUID query.
var busyboxApplets = []string{"sh", "sleep", "ls", "cat", "env", "grep"}

// ImportImages imports the daemons' images (`make sim-images`) and packs
// the vLLM stand-in and busybox test images as OCI archives under
// <run dir>/nvinject-images, importing them into the node's containerd
// and every worker's (there is no registry). With the real driver root the vLLM stand-in's
// image is Debian bookworm (see vllmImage).
func (d *Deployer) ImportImages(ctx context.Context) error {
	for _, a := range releaseArchives {
		archive := filepath.Join(d.repo, SimImagesDir, a)
		if _, err := os.Stat(archive); err != nil {
			return fmt.Errorf("image %s: %w; run `make sim-images`", archive, err)
		}
		if err := d.importEverywhere(ctx, archive); err != nil {
			return err
		}
	}
	dir := filepath.Join(d.node.RunDir(), "nvinject-images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create image dir %s: %w", dir, err)
	}
	imgs := map[string]*ociimage.Image{}
	bb := ociimage.New(BusyboxImage, ociimage.WithEntrypoint("/bin/sh"))
	if err := bb.AddFile("/bin/busybox", "/bin/busybox"); err != nil {
		return fmt.Errorf("busybox image: %w; apt-get install busybox-static", err)
	}
	for _, a := range busyboxApplets {
		bb.AddSymlink("/bin/"+a, "busybox")
	}
	if err := bb.AddFile(d.Bin("nvidia-smi-sim"), "/usr/bin/nvidia-smi-sim"); err != nil {
		return fmt.Errorf("busybox image: %w; run `make build` first", err)
	}
	imgs[BusyboxImage] = bb
	vllm, err := d.vllmImage(ctx)
	if err != nil {
		return err
	}
	imgs[VLLMImage] = vllm
	for ref, img := range imgs {
		archive := filepath.Join(dir, archiveName(ref))
		if err := img.WriteArchiveFile(archive); err != nil {
			return fmt.Errorf("write image archive %s: %w", archive, err)
		}
		if err := d.importEverywhere(ctx, archive); err != nil {
			return err
		}
	}
	return nil
}

// importEverywhere imports archive into every node's containerd.
func (d *Deployer) importEverywhere(ctx context.Context, archive string) error {
	if err := d.node.ImportImage(ctx, archive); err != nil {
		return err
	}
	for _, w := range d.node.Workers() {
		if err := w.ImportImage(ctx, archive); err != nil {
			return err
		}
	}
	return nil
}

func archiveName(ref string) string {
	return strings.NewReplacer("/", "_", ":", "_").Replace(ref) + ".tar"
}

// vllmPrograms go into the vLLM stand-in's image at /usr/bin: the stand-in,
// the probe that loads the driver's libraries as CUDA programs do, and the
// SIMULATED GPUs' UUID query.
var vllmPrograms = []string{"vllm-standin", "gpu-probe", "nvidia-smi-sim"}

// vllmImage is the vLLM stand-in's image. With the real driver root its base
// is a Debian bookworm root file system (e2e/harness/bookworm; vLLM's images are
// Debian/Ubuntu based): glibc and ldconfig, which NVIDIA's libraries and the
// CDI spec's update-ldcache hook need; the programs are copied as they are
// (the host is bookworm too). With the simulated root, whose libraries are
// placeholders, it is the programs and their ldd libraries only.
func (d *Deployer) vllmImage(ctx context.Context) (*ociimage.Image, error) {
	entry := ociimage.WithEntrypoint("/usr/bin/vllm-standin")
	if !d.driver.Real() {
		img := ociimage.New(VLLMImage, entry)
		for _, p := range vllmPrograms {
			if err := img.AddBinary(d.Bin(p), "/usr/bin/"+p); err != nil {
				return nil, fmt.Errorf("image %s: %w; run `make build` first", VLLMImage, err)
			}
		}
		return img, nil
	}
	base, err := bookworm.Rootfs(ctx)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", VLLMImage, err)
	}
	img := ociimage.New(VLLMImage, entry, ociimage.WithBaseLayer(base))
	for _, p := range vllmPrograms {
		if err := img.AddFile(d.Bin(p), "/usr/bin/"+p); err != nil {
			return nil, fmt.Errorf("image %s: %w; run `make build` first", VLLMImage, err)
		}
	}
	d.log.Info("vLLM stand-in image on Debian bookworm", "base", base)
	return img, nil
}
