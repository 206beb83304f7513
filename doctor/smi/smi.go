// Package smi runs nvidia-smi (real or nvinject's simulated one) and reads
// its GPU list and the MIG devices under each GPU.
package smi

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
)

// Query is the worker check (nvidia-smi on the worker), with MIG mode pending a reset.
var Query = []string{"--query-gpu=index,uuid,name,mig.mode.current,mig.mode.pending", "--format=csv,noheader"}

// MIGEnabled is mig.mode.current of a GPU with MIG mode on.
const MIGEnabled = "Enabled"

// GPU is one line of the query. MIGPending is the MIG mode the GPU takes at
// its next reset ("[N/A]" without MIG support).
type GPU struct{ Index, UUID, Name, MIGMode, MIGPending string }

// ErrNotRun is wrapped when nvidia-smi could not be started at all (so
// nothing is known about the driver).
var ErrNotRun = errors.New("nvidia-smi could not be started")

// Result is one run.
type Result struct {
	Output string
	GPUs   []GPU
	// Failed is the exit status when nvidia-smi ran and failed.
	Failed string
}

// Run executes the command line with the query appended. The command may
// carry a prefix that reaches the worker, as the nvkind setup does:
// "docker exec k8s-ai-infra-worker nvidia-smi".
func Run(ctx context.Context, command string) (Result, error) {
	r, err := run(ctx, command, Query...)
	if err != nil || r.Failed != "" {
		return r, err
	}
	gpus, err := Parse(r.Output)
	if err != nil {
		r.Failed = err.Error()
		return r, nil
	}
	r.GPUs = gpus
	return r, nil
}

// run executes the command line with args appended: Failed is set when it
// ran and exited non-zero, an error wrapping ErrNotRun when it did not run.
func run(ctx context.Context, command string, args ...string) (Result, error) {
	argv := strings.Fields(command)
	if len(argv) == 0 {
		return Result{}, fmt.Errorf("%w: empty command", ErrNotRun)
	}
	path := argv[0]
	cmd := exec.CommandContext(ctx, path, append(argv[1:], args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	r := Result{Output: out.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.Failed = exit.String()
	case err != nil:
		return r, fmt.Errorf("%w: %s: %w", ErrNotRun, path, err)
	}
	return r, nil
}

// MIGDevice is one MIG device `nvidia-smi -L` lists under its GPU.
type MIGDevice struct{ Parent, Profile, UUID string }

// List runs `nvidia-smi -L` and returns the MIG devices it lists, each with
// its parent GPU's UUID: the driver's live MIG layout.
func List(ctx context.Context, command string) ([]MIGDevice, error) {
	r, err := run(ctx, command, "-L")
	if err != nil {
		return nil, err
	}
	if r.Failed != "" {
		return nil, fmt.Errorf("%s -L failed (%s): %s", strings.Fields(command)[0], r.Failed, strings.TrimSpace(r.Output))
	}
	return ParseList(r.Output)
}

// The lines of `nvidia-smi -L`: "GPU 0: NAME (UUID: GPU-…)" and, under a
// GPU with MIG mode on, "  MIG 1g.10gb     Device  0: (UUID: MIG-…)".
var (
	gpuLine = regexp.MustCompile(`^GPU \d+: .*\(UUID: (GPU-[^)\s]+)\)`)
	migLine = regexp.MustCompile(`^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)\s]+)\)`)
)

// ParseList reads `nvidia-smi -L` output. A MIG line before any GPU line is
// an error: its parent would be unknown.
func ParseList(out string) ([]MIGDevice, error) {
	var devs []MIGDevice
	parent := ""
	for _, line := range strings.Split(out, "\n") {
		if m := gpuLine.FindStringSubmatch(line); m != nil {
			parent = m[1]
			continue
		}
		m := migLine.FindStringSubmatch(line)
		switch {
		case m == nil:
		case parent == "":
			return nil, fmt.Errorf("nvidia-smi -L lists MIG device %s before any GPU: %q", m[2], line)
		default:
			devs = append(devs, MIGDevice{Parent: parent, Profile: m[1], UUID: m[2]})
		}
	}
	return devs, nil
}

// Parse reads "index, uuid, name[, mig mode[, pending mig mode]]" CSV lines.
func Parse(out string) ([]GPU, error) {
	rd := csv.NewReader(strings.NewReader(out))
	rd.FieldsPerRecord = -1
	rd.TrimLeadingSpace = true
	recs, err := rd.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("read nvidia-smi output as CSV: %w", err)
	}
	var gpus []GPU
	for _, rec := range recs {
		if len(rec) < 3 {
			return nil, fmt.Errorf("nvidia-smi line %q: want index, uuid, name[, mig mode]", strings.Join(rec, ","))
		}
		g := GPU{Index: rec[0], UUID: rec[1], Name: rec[2]}
		if len(rec) > 3 {
			g.MIGMode = rec[3]
		}
		if len(rec) > 4 {
			g.MIGPending = rec[4]
		}
		gpus = append(gpus, g)
	}
	return gpus, nil
}
