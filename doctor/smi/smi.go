// Package smi runs nvidia-smi (real or nvinject's simulated one) and reads
// its GPU list.
package smi

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// Query is the seed's worker check, with MIG mode pending a reset.
var Query = []string{"--query-gpu=index,uuid,name,mig.mode.current,mig.mode.pending", "--format=csv,noheader"}

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
// carry a prefix that reaches the worker, as the seed does:
// "docker exec k8s-ai-infra-worker nvidia-smi".
func Run(ctx context.Context, command string) (Result, error) {
	argv := strings.Fields(command)
	if len(argv) == 0 {
		return Result{}, fmt.Errorf("%w: empty command", ErrNotRun)
	}
	path := argv[0]
	cmd := exec.CommandContext(ctx, path, append(argv[1:], Query...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	r := Result{Output: out.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.Failed = exit.String()
		return r, nil
	case err != nil:
		return r, fmt.Errorf("%w: %s: %w", ErrNotRun, path, err)
	}
	gpus, err := Parse(r.Output)
	if err != nil {
		r.Failed = err.Error()
		return r, nil
	}
	r.GPUs = gpus
	return r, nil
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
