package gpunode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nvinject/nvinject/cdi/driver"
	"github.com/nvinject/nvinject/shared/logging"
)

// The driver under a running node: the CDI spec names the files of the
// driver it was made from (libcuda.so.<version>, its firmware); a driver
// upgrade replaces them in the driver root. The node cannot follow in
// process: the old driver's NVML library is loaded in it, and the real one
// refuses a newer kernel module. So, once the root holds another version,
// it says so on /readyz, removes its spec so no runtime serves it, and
// ends with ErrDriverChanged: the DaemonSet restarts it, the new process
// loads the new driver's NVML and writes its spec. Running containers keep
// what they were given.

// ErrDriverChanged ends a node whose driver root changed driver version.
var ErrDriverChanged = errors.New("the driver root's driver changed")

// watchDriver checks the driver root's version every
// --driver-check-interval against served, the version gpus' spec was
// made for; it returns ErrDriverChanged once they differ, nil when ctx
// ends.
func (n *Node) watchDriver(ctx context.Context, gpus GPUs) error {
	served := gpus.Node.DriverVersion
	if n.cfg.DriverCheck <= 0 || n.cfg.DriverRoot == "" || served == "" {
		return nil
	}
	if _, ok, _ := driver.Installed(n.cfg.DriverRoot); !ok {
		// A root without a driver's libraries (NVML from elsewhere) has no version to follow.
		return nil
	}
	t := time.NewTicker(n.cfg.DriverCheck)
	defer t.Stop()
	warned := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		v, ok, err := driver.Installed(n.cfg.DriverRoot)
		switch {
		case err != nil:
			// Mid-upgrade a root can hold both drivers for a moment.
			if !warned {
				n.log.Warn("cannot read the driver root's version; the CDI spec stays as it is until it can be read", logging.Err(err), "driver_root", n.cfg.DriverRoot)
				warned = true
			}
			continue
		case !ok || v.Version == served:
			warned = false
			continue
		}
		why := fmt.Sprintf("the driver root %s now holds driver %s (%s) but the CDI spec %s was made for %s: it is stale and removed; restarting to load driver %s",
			n.cfg.DriverRoot, v.Version, v.File, gpus.specPath, served, v.Version)
		n.state.SetNotReady(why)
		n.log.Error("driver changed under the node", "driver_root", n.cfg.DriverRoot, "served", served, "now", v.Version, "spec", gpus.specPath)
		if err := os.Remove(gpus.specPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			n.log.Error("cannot remove the stale CDI spec; remove it by hand", logging.Err(err), "spec", gpus.specPath)
		}
		return fmt.Errorf("%w from %s to %s: restarting so the DaemonSet starts nvinject on the new driver", ErrDriverChanged, served, v.Version)
	}
}
