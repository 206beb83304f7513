package nodemove

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// TestSet: nothing is handed out before the first poll or while polls
// fail; a DRA holder withholds its GPU only; each change is logged once,
// naming the holders.
func TestSet(t *testing.T) {
	var log bytes.Buffer
	s := NewSet(DRAClaims("gpu.nvinject.io"), []string{"GPU-a", "GPU-b"}, slog.New(slog.NewTextHandler(&log, nil)), nil)
	withheld := func() (out []string) {
		for _, u := range []string{"GPU-a", "GPU-b"} {
			if why, ok := s.Withheld(u); ok {
				out = append(out, u+": "+why)
			}
		}
		return out
	}
	if w := withheld(); len(w) != 2 || s.Err() == nil {
		t.Errorf("before the first poll: withheld %v, err %v; want both, an error", w, s.Err())
	}
	changed, cancel := s.Subscribe()
	defer cancel()
	vllm := Holder{Pod: "default/vllm", Container: "main", Claim: "default/vllm-gpu"}
	s.Update(Result{Holders: Holders{"GPU-b": {vllm}}})
	<-changed
	if w := withheld(); len(w) != 1 || !strings.Contains(w[0], "GPU-b: held through DRA by default/vllm/main (claim default/vllm-gpu)") || s.Err() != nil {
		t.Errorf("held by a claim: withheld %v, err %v", w, s.Err())
	}
	s.Update(Result{Err: errors.New("connection refused")})
	if w := withheld(); len(w) != 2 || !strings.Contains(w[0], "connection refused") {
		t.Errorf("PodResources down: withheld %v", w)
	}
	s.Update(Result{Holders: Holders{}})
	if w := withheld(); len(w) != 0 {
		t.Errorf("nothing held: withheld %v", w)
	}
	for want, n := range map[string]int{"GPU held by a DRA claim": 1, "every GPU is published Unhealthy": 1, "readable again": 1, "claim default/vllm-gpu": 1} {
		if got := strings.Count(log.String(), want); got != n {
			t.Errorf("log has %q %d times, want %d:\n%s", want, got, n, log.String())
		}
	}
}

// TestSetReadAndWords: Read is closed by the first Update only; nvinject-dra's
// set speaks of device-plugin pods and taints.
func TestSetReadAndWords(t *testing.T) {
	var log bytes.Buffer
	s := NewSet(DevicePluginPods("nvidia.com/gpu"), []string{"GPU-a"}, slog.New(slog.NewTextHandler(&log, nil)), nil)
	select {
	case <-s.Read():
		t.Fatal("Read closed before the first Update")
	default:
	}
	s.Update(Result{Holders: Holders{"GPU-a": {{Pod: "default/vllm", Container: "main"}}}})
	<-s.Read()
	s.Update(Result{Err: errors.New("connection refused")})
	if why, ok := s.Withheld("GPU-a"); !ok || why != "connection refused" {
		t.Errorf("Withheld while PodResources is down = %q, %v", why, ok)
	}
	s.Update(Result{Holders: Holders{"GPU-a": {{Pod: "default/vllm", Container: "main"}}}})
	if why, _ := s.Withheld("GPU-a"); why != "held through the device plugin by default/vllm/main" {
		t.Errorf("Withheld = %q", why)
	}
	for _, want := range []string{"GPU held by a device-plugin pod: tainted gpu.nvinject.io/device-plugin-pod until its pod ends", "every GPU is tainted gpu.nvinject.io/device-plugin-pod until"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
}
