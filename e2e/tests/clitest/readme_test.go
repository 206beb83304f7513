package clitest

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// Every `make TARGET` the README names is a target `make help` lists, so a
// newcomer can find each one there.
func TestReadmeTargetsAreInMakeHelp(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make on PATH")
	}
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	help := exec.Command("make", "--no-print-directory", "help")
	help.Dir = "../../.."
	out, err := help.Output()
	if err != nil {
		t.Fatalf("make help: %v", err)
	}
	listed := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			listed[f[0]] = true
		}
	}
	named := regexp.MustCompile("(?m)(?:`|^)make ([a-z0-9-]+)").FindAllStringSubmatch(string(readme), -1)
	if len(named) < 5 {
		t.Fatalf("the README names %d make targets; want the two commands and more", len(named))
	}
	for _, m := range named {
		if !listed[m[1]] {
			t.Errorf("the README names `make %s`, which `make help` does not list", m[1])
		}
	}
}
