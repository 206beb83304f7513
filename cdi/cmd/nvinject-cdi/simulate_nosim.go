//go:build nosim

package main

import (
	"context"
	"errors"
	"io"
)

// simulate: a release build writes no SIMULATED driver roots.
func simulate(context.Context, []string, io.Writer, io.Writer) error {
	return errors.New("simulate-driver-root is test and demo equipment, and this is a release build without the GPU simulation (nosim tag): use the equipment build's nvinject-cdi (make equipment)")
}
