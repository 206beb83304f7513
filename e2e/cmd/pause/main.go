// Command pause is the pod sandbox's init process: it holds the pod's namespaces open,
// reaps orphaned children and exits promptly on SIGTERM or SIGINT.
package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/nvinject/nvinject/shared/cli"
)

func main() {
	c := cli.New("pause", "", cli.WithAbout("The pod sandbox's init process: holds the pod's namespaces open, reaps orphaned children, exits on SIGTERM or SIGINT."))
	err := c.Parse(os.Args[1:], nil)
	if err == nil && len(c.Args()) > 0 {
		err = cli.Usagef("unexpected arguments %q; pause takes none", c.Args())
	}
	if err != nil {
		os.Exit(cli.Code("pause", err, os.Stderr))
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child, as PID 1 in a namespace must.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
