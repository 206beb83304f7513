package scenarios

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkGPUPodStart is the DRA path's pod start against its anchor, the
// device plugin's, in the same run on the same node. device-plugin: pods
// ask nvidia.com/gpu: 1 through the device plugin. Then the node moves to
// nvinject-dra, and dra: each iteration a pod asks the same way (KEP-5004)
// and one asks by ResourceClaimTemplate. The node moves back after. Each
// sample is create to Running; the pod is then deleted (until its sandbox
// has stopped), untimed. The two paths cannot interleave pod by pod: a node
// has one owner of its GPU and a move takes seconds. make bench-node runs
// it with -benchtime 10x (n = 10 a path); dra reports its ratios to the
// anchor and both daemons' idle memory (RSS, and its anonymous part: not
// the binary's clean file pages).
func BenchmarkGPUPodStart(b *testing.B) {
	d := need(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := d.ImportDRAImage(ctx); err != nil {
		b.Fatal(err)
	}
	start := func(b *testing.B, name string, s podSpec, claim string) time.Duration {
		t0 := time.Now()
		createDRAPod(b, ctx, name, s, claim)
		waitPod(b, ctx, name, 2*time.Minute, "Running", running)
		took := time.Since(t0)
		deletePod(b, name)
		return took
	}
	var dp, ext, tmpl []time.Duration
	b.Run("device-plugin", func(b *testing.B) {
		for b.Loop() {
			dp = append(dp, start(b, "bench-dp-"+strconv.Itoa(len(dp)), gpuPod, ""))
		}
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(p50ms(dp), "p50-ms")
	})
	dpMem, dpErr := processMemory("nvinject-device-plugin")
	if _, err := d.SwitchToDRA(ctx, dep, 3*time.Minute); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if _, err := d.SwitchToDevicePlugin(context.Background(), dep, 3*time.Minute); err != nil {
			b.Errorf("move the node back to the device plugin: %v", err)
		}
	})
	waitCapacity(b, ctx, 0, time.Minute)
	createTemplate(b, ctx)
	b.Run("dra", func(b *testing.B) {
		for b.Loop() {
			i := strconv.Itoa(len(ext))
			ext = append(ext, start(b, "bench-dra-ext-"+i, gpuPod, ""))
			tmpl = append(tmpl, start(b, "bench-dra-claim-"+i, podSpec{runtimeClass: true}, "gpu-80gb"))
		}
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(p50ms(ext), "ext-p50-ms")
		b.ReportMetric(p50ms(tmpl), "claim-p50-ms")
		if len(dp) > 0 {
			b.ReportMetric(p50ms(ext)/p50ms(dp), "ext/dp-p50")
			b.ReportMetric(p50ms(tmpl)/p50ms(dp), "claim/dp-p50")
		}
		draMem, draErr := processMemory("nvinject-dra")
		if dpErr != nil || draErr != nil {
			b.Logf("idle memory not read: %v; %v", dpErr, draErr)
			return
		}
		b.ReportMetric(mib(dpMem.rss), "dp-rss-MiB")
		b.ReportMetric(mib(draMem.rss), "dra-rss-MiB")
		b.ReportMetric(float64(draMem.rss)/float64(dpMem.rss), "dra/dp-rss")
		b.ReportMetric(float64(draMem.anon)/float64(dpMem.anon), "dra/dp-anon")
	})
}

func mib(kib int64) float64 { return float64(kib) / 1024 }

// memory is a process's resident set and its anonymous part, in KiB.
type memory struct{ rss, anon int64 }

// processMemory reads /proc/PID/status of the host process running
// /usr/bin/<program> (the daemons run in host-PID-visible containers).
func processMemory(program string) (memory, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return memory{}, err
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.HasPrefix(cmd, []byte("/usr/bin/"+program+"\x00")) {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			return memory{}, err
		}
		var m memory
		for _, l := range strings.Split(string(status), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			switch f[0] {
			case "VmRSS:":
				m.rss, err = strconv.ParseInt(f[1], 10, 64)
			case "RssAnon:":
				m.anon, err = strconv.ParseInt(f[1], 10, 64)
			}
			if err != nil {
				return memory{}, fmt.Errorf("%s of %s: %w", f[0], program, err)
			}
		}
		if m.rss == 0 || m.anon == 0 {
			return memory{}, fmt.Errorf("no VmRSS/RssAnon in /proc/%s/status of %s", e.Name(), program)
		}
		return m, nil
	}
	return memory{}, fmt.Errorf("no process /usr/bin/%s on this host", program)
}

func p50ms(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Millisecond)
}
