package proc

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

func TestStartFindStop(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep program")
	}
	dir := t.TempDir()
	spec := Spec{Name: "sleep", Path: sleep, Args: []string{"60"},
		LogFile: filepath.Join(dir, "sleep.log"), PidFile: filepath.Join(dir, "sleep.pid")}
	pid, err := Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Find(spec.PidFile); err != nil || got != pid {
		t.Fatalf("Find = %d, %v; want %d", got, err, pid)
	}
	if err := Stop(context.Background(), spec.PidFile, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if Running(pid, "") {
		t.Errorf("pid %d still running after Stop", pid)
	}
	if got, err := Find(spec.PidFile); err != nil || got != 0 {
		t.Errorf("Find after Stop = %d, %v; want 0", got, err)
	}
}

func TestFindIgnoresOtherProgram(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep program")
	}
	dir := t.TempDir()
	spec := Spec{Name: "sleep", Path: sleep, Args: []string{"60"}, Binary: "/not/this/program",
		LogFile: filepath.Join(dir, "sleep.log"), PidFile: filepath.Join(dir, "sleep.pid")}
	pid, err := Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer Kill(context.Background(), pid)
	if got, _ := Find(spec.PidFile); got != 0 {
		t.Errorf("Find matched pid %d running another program", got)
	}
}
