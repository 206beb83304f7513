// Command nvinject-image writes an OCI image archive from host files, for
// `ctr -n k8s.io images import`, without Docker, a registry or umoci.
//
//	nvinject-image -ref docker.io/library/busybox:nvinject -o busybox.tar \
//	    -file /bin/busybox=/bin/busybox -link /bin/sh=busybox -entrypoint /bin/sh
//
// -bin adds a program plus the shared libraries ldd reports (for cgo programs).
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/nvinject/nvinject/e2e/ociimage"
)

type pairs []string

func (p *pairs) String() string     { return strings.Join(*p, ",") }
func (p *pairs) Set(v string) error { *p = append(*p, v); return nil }

func main() {
	if err := run(); err != nil {
		slog.Error("nvinject-image failed", "err", err)
		os.Exit(1)
	}
}

func run() error {
	var files, bins, links, env pairs
	ref := flag.String("ref", "", "image reference to tag the image with (required)")
	out := flag.String("o", "", "archive file to write (required)")
	entrypoint := flag.String("entrypoint", "", "entrypoint, space separated")
	cmd := flag.String("cmd", "", "default arguments, space separated")
	flag.Var(&files, "file", "HOST=IMAGE: copy a host file into the image (repeatable)")
	flag.Var(&bins, "bin", "HOST=IMAGE: copy a program and the libraries ldd reports (repeatable)")
	flag.Var(&links, "link", "IMAGE=TARGET: add a symlink (repeatable)")
	flag.Var(&env, "env", "KEY=VALUE added to the image environment (repeatable)")
	flag.Parse()
	if *ref == "" || *out == "" {
		flag.Usage()
		return fmt.Errorf("-ref and -o are required")
	}
	img := ociimage.New(*ref, ociimage.WithEntrypoint(strings.Fields(*entrypoint)...),
		ociimage.WithCmd(strings.Fields(*cmd)...), ociimage.WithEnv(env...))
	for _, f := range files {
		host, dst, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("-file %q: want HOST=IMAGE", f)
		}
		if err := img.AddFile(host, dst); err != nil {
			return err
		}
	}
	for _, b := range bins {
		host, dst, ok := strings.Cut(b, "=")
		if !ok {
			return fmt.Errorf("-bin %q: want HOST=IMAGE", b)
		}
		if err := img.AddBinary(host, dst); err != nil {
			return err
		}
	}
	for _, l := range links {
		dst, target, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("-link %q: want IMAGE=TARGET", l)
		}
		img.AddSymlink(dst, target)
	}
	return img.WriteArchiveFile(*out)
}
