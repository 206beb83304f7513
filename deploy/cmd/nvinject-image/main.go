// Command nvinject-image writes an OCI image archive from host files, for
// `ctr -n k8s.io images import`, without Docker, a registry or umoci.
//
//	nvinject-image -ref docker.io/library/busybox:nvinject -o busybox.tar \
//	    -file /bin/busybox=/bin/busybox -link /bin/sh=busybox -entrypoint /bin/sh
//
// -bin adds a program plus the shared libraries ldd reports (for cgo programs).
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/nvinject/nvinject/deploy/ociimage"
	"github.com/nvinject/nvinject/shared/cli"
)

type pairs []string

func (p *pairs) String() string     { return strings.Join(*p, ",") }
func (p *pairs) Set(v string) error { *p = append(*p, v); return nil }

const name = "nvinject-image"

func main() { os.Exit(cli.Code(name, run(os.Args[1:]), os.Stderr)) }

func run(args []string) error {
	var files, bins, links, env pairs
	c := cli.New(name, "--ref REF -o FILE [flags]", cli.WithAbout("Writes an OCI image archive from host files, for `ctr -n k8s.io images import`, without Docker, a registry or umoci."))
	flag := c.Flags()
	ref := flag.String("ref", "", "image reference to tag the image with (required)")
	out := flag.String("o", "", "archive file to write (required)")
	entrypoint := flag.String("entrypoint", "", "entrypoint, space separated")
	cmd := flag.String("cmd", "", "default arguments, space separated")
	flag.Var(&files, "file", "HOST=IMAGE: copy a host file into the image (repeatable)")
	flag.Var(&bins, "bin", "HOST=IMAGE: copy a program and the libraries ldd reports (repeatable)")
	flag.Var(&links, "link", "IMAGE=TARGET: add a symlink (repeatable)")
	flag.Var(&env, "env", "KEY=VALUE added to the image environment (repeatable)")
	var debs, labels, trees pairs
	flag.Var(&debs, "dpkg", "installed Debian package whose files (dpkg -L) go into the image, e.g. libc6 (repeatable)")
	flag.Var(&trees, "tree", "HOST=IMAGE: copy a host directory tree into the image (repeatable)")
	flag.Var(&labels, "label", "KEY=VALUE image config label (repeatable)")
	user := flag.String("user", "", "user the image runs as by default, e.g. 65532:65532")
	list := flag.String("list", "", "write the image's file list to this file")
	if err := c.Parse(args, nil); err != nil {
		return err
	}
	if *ref == "" || *out == "" {
		return cli.Usagef("--ref and -o are required (see %s --help)", name)
	}
	if len(c.Args()) > 0 {
		return cli.Usagef("unexpected arguments %q", c.Args())
	}
	lbl := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return cli.Usagef("--label %q: want KEY=VALUE", l)
		}
		lbl[k] = v
	}
	img := ociimage.New(*ref, ociimage.WithEntrypoint(strings.Fields(*entrypoint)...),
		ociimage.WithCmd(strings.Fields(*cmd)...), ociimage.WithEnv(env...), ociimage.WithUser(*user), ociimage.WithLabels(lbl))
	for _, d := range debs {
		if err := img.AddDebianPackage(d); err != nil {
			return err
		}
	}
	for _, tr := range trees {
		host, dst, ok := strings.Cut(tr, "=")
		if !ok {
			return cli.Usagef("--tree %q: want HOST=IMAGE", tr)
		}
		if err := img.AddTree(host, dst); err != nil {
			return err
		}
	}
	for _, f := range files {
		host, dst, ok := strings.Cut(f, "=")
		if !ok {
			return cli.Usagef("-file %q: want HOST=IMAGE", f)
		}
		if err := img.AddFile(host, dst); err != nil {
			return err
		}
	}
	for _, b := range bins {
		host, dst, ok := strings.Cut(b, "=")
		if !ok {
			return cli.Usagef("-bin %q: want HOST=IMAGE", b)
		}
		if err := img.AddBinary(host, dst); err != nil {
			return err
		}
	}
	for _, l := range links {
		dst, target, ok := strings.Cut(l, "=")
		if !ok {
			return cli.Usagef("-link %q: want IMAGE=TARGET", l)
		}
		img.AddSymlink(dst, target)
	}
	if *list != "" {
		if err := os.WriteFile(*list, []byte(strings.Join(img.FileList(), "\n")+"\n"), 0o644); err != nil {
			return fmt.Errorf("write file list: %w", err)
		}
	}
	return img.WriteArchiveFile(*out)
}
