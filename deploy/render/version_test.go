package render

import (
	"os"
	"regexp"
	"testing"
)

// TestOneVersion: the Makefile's VERSION is the one version; the chart, the
// Kustomize image tags and the image builder all carry it.
func TestOneVersion(t *testing.T) {
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	m := regexp.MustCompile(`(?m)^VERSION \?= (\S+)$`).FindStringSubmatch(read("../../Makefile"))
	if m == nil {
		t.Fatal("the Makefile sets no VERSION ?= line")
	}
	v := m[1]
	chart := read("../helm/nvinject/Chart.yaml")
	for _, want := range []string{"\nversion: " + v + "\n", "\nappVersion: " + v + "\n"} {
		if !regexp.MustCompile(regexp.QuoteMeta(want)).MatchString(chart) {
			t.Errorf("Chart.yaml lacks %q (VERSION is %s): run make set-version", want, v)
		}
	}
	for file, n := range map[string]int{"../base/kustomization.yaml": 2, "../components/dra/kustomization.yaml": 1} {
		tags := regexp.MustCompile(`newTag: (\S+)`).FindAllStringSubmatch(read(file), -1)
		if len(tags) != n {
			t.Fatalf("%s has %d image tags, want %d", file, len(tags), n)
		}
		for _, tag := range tags {
			if tag[1] != "v"+v {
				t.Errorf("%s tags an image %s, want v%s: run make set-version", file, tag[1], v)
			}
		}
	}
}
