// Package version reports the build's version and VCS revision, set by the
// Makefile with -ldflags -X (a build without them reports "dev" and the
// revision Go recorded, if any).
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set with -ldflags "-X github.com/nvinject/nvinject/shared/version.Version=…".
var (
	Version  = "dev"
	Revision = ""
)

// Rev returns the VCS revision: the linked-in one, else Go's build info.
func Rev() string {
	if Revision != "" {
		return Revision
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// String is the one-line --version answer for program name.
func String(name string) string {
	return fmt.Sprintf("%s %s (revision %s, %s %s/%s)", name, Version, Rev(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
