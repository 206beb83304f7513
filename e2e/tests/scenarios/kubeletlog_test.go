package scenarios

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
)

// kubeletAlreadyConnected is the error kubelet 1.37.2 logs when a device
// plugin registers a socket its device manager still holds an endpoint
// for ("Failed to connect to new client" err="device plugin already
// connected: <socket>", pkg/kubelet/cm/devicemanager PluginConnected).
// kubelet keeps the stale endpoint and the plugin gets no new connection
// until kubelet restarts again: its GPUs are not served in between.
const kubeletAlreadyConnected = "already connected"

// failOnKubeletRefusedRegister makes t fail, when it ends (after its own
// cleanups, which may restart kubelet too), for every line kubelet logs
// from now on saying a device plugin was "already connected", naming the
// line. Every test that restarts kubelet calls it first.
func failOnKubeletRefusedRegister(t *testing.T) {
	t.Helper()
	path := need(t).Node().LogFile("kubelet")
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("kubelet log: %v", err)
	}
	from := st.Size()
	t.Cleanup(func() {
		lines, err := logLinesFrom(path, from, kubeletAlreadyConnected)
		if err != nil {
			t.Errorf("scan kubelet's log for refused registrations: %v", err)
		}
		for _, l := range lines {
			t.Errorf("kubelet refused a device plugin's Register (%s, from byte %d): %s", path, from, l)
		}
	})
}

// logLinesFrom returns the lines of the log at path, from byte offset from
// on, that contain text.
func logLinesFrom(path string, from int64, text string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return nil, fmt.Errorf("seek %s to %d: %w", path, from, err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, text) {
			out = append(out, l)
		}
	}
	return out, nil
}
