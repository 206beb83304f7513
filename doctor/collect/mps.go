package collect

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nvinject/nvinject/doctor/evidence"
)

// mpsDialTimeout bounds one connect to an MPS control socket: the kernel
// completes it at once while the daemon listens, so the bound only guards
// against a stuck filesystem.
const mpsDialTimeout = time.Second

// dialMPS connects to the control socket of each device's MPS daemon
// (<pipe dir>/control, which nvidia-cuda-mps-control listens on) and
// records whether it is down: the socket missing, or refusing.
func dialMPS(devs []evidence.CDIDevice) {
	for _, d := range devs {
		if d.MPS == nil {
			continue
		}
		sock := filepath.Join(d.MPS.PipeDir, "control")
		// NVIDIA's control daemon listens on a SOCK_SEQPACKET socket; a
		// stream connect gets EPROTOTYPE even while it is up.
		c, err := net.DialTimeout("unixpacket", sock, mpsDialTimeout)
		switch {
		case err == nil:
			c.Close()
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ECONNREFUSED):
			d.MPS.Down = err.Error()
		default:
			d.MPS.Unread = fmt.Sprintf("connect to %s (run the doctor as root on the worker): %v", sock, err)
		}
	}
}
