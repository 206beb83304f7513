package injbench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/nvinject/nvinject/e2e/internal/hostclean"
	"github.com/nvinject/nvinject/e2e/internal/proc"
)

// prepareRunDir refuses a run dir a live benchmark uses, and removes what
// an interrupted earlier run left there.
func (b *Bench) prepareRunDir(ctx context.Context) error {
	if pids := hostclean.Processes(b.tool("containerd"), b.layout.containerdConfig()); len(pids) > 0 {
		return fmt.Errorf("containerd %v already runs from %s: wait for that benchmark or pass another -run-dir", pids, b.layout.dir)
	}
	if _, err := os.Stat(b.layout.dir); errors.Is(err, os.ErrNotExist) {
		return os.MkdirAll(b.layout.dir, 0o755)
	}
	b.log.Info("cleaning what an earlier run left", "runDir", b.layout.dir)
	if err := errors.Join(b.cleanHost(ctx), hostclean.RemoveRunDir(b.layout.dir)); err != nil {
		return fmt.Errorf("clean the earlier run in %s: %w", b.layout.dir, err)
	}
	return nil
}

// teardown follows the order that leaves nothing behind: pods, then the
// plugin, then containerd, stray shims, mounts, cgroups, and finally the
// run dir (logs are kept). It reports anything that remains.
func (b *Bench) teardown(ctx context.Context, client *criClient, plugin, ctrd *daemon) error {
	var errs []error
	if client != nil {
		if ctrd.exited() == nil {
			rctx, cancel := context.WithTimeout(ctx, 2*b.timeout)
			errs = append(errs, client.removeAllPods(rctx))
			cancel()
		}
		errs = append(errs, client.close())
	}
	errs = append(errs, plugin.stop(ctx, b.log, 10*time.Second), ctrd.stop(ctx, b.log, 30*time.Second))
	errs = append(errs, b.cleanHost(ctx))
	if left := b.leftovers(); left != nil {
		errs = append(errs, left)
	} else {
		errs = append(errs, hostclean.RemoveRunDir(b.layout.dir))
	}
	return errors.Join(errs...)
}

// cleanHost kills shims of this run's containerd, unmounts everything
// under the run dir and removes the benchmark's cgroups.
func (b *Bench) cleanHost(ctx context.Context) error {
	for _, pid := range hostclean.Processes("containerd-shim", b.layout.containerdSocket()) {
		b.log.Warn("killing leftover shim", "pid", pid)
		proc.Kill(ctx, pid)
	}
	return errors.Join(hostclean.UnmountUnder(b.layout.dir), hostclean.RemoveCgroups(cgroupParent))
}

// leftovers lists processes, mounts and cgroups of this run still present.
func (b *Bench) leftovers() error {
	var errs []error
	for _, word := range []string{b.layout.containerdConfig(), b.layout.containerdSocket(), b.layout.nriSocket()} {
		if pids := hostclean.Processes(word); len(pids) > 0 {
			errs = append(errs, fmt.Errorf("processes still using %s: %v; kill them", word, pids))
		}
	}
	if mounts, err := hostclean.MountsUnder(b.layout.dir); err != nil || len(mounts) > 0 {
		errs = append(errs, fmt.Errorf("mounts left under %s: %v %w", b.layout.dir, mounts, err))
	}
	if left := hostclean.CgroupsLeft(cgroupParent); len(left) > 0 {
		errs = append(errs, fmt.Errorf("cgroups left: %v", left))
	}
	return errors.Join(errs...)
}

func httpOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
