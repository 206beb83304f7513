package kwok

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestConfigFileHoldsOptionsThenStages(t *testing.T) {
	for _, tc := range []struct {
		parallelism, leases int
		want                map[string]any
	}{
		{0, 0, map[string]any{"nodeLeaseDurationSeconds": 40.0}},
		{16, 0, map[string]any{"nodeLeaseDurationSeconds": 40.0, "podPlayStageParallelism": 16.0, "nodePlayStageParallelism": 16.0}},
		{16, 50, map[string]any{"nodeLeaseDurationSeconds": 40.0, "podPlayStageParallelism": 16.0,
			"nodePlayStageParallelism": 16.0, "nodeLeaseParallelism": 50.0}},
	} {
		docs := strings.Split(string(configFile(Config{Parallelism: tc.parallelism, LeaseParallelism: tc.leases})), "\n---\n")
		var conf struct {
			Kind    string
			Options map[string]any
		}
		if err := yaml.Unmarshal([]byte(docs[0]), &conf); err != nil {
			t.Fatal(err)
		}
		if conf.Kind != "KwokConfiguration" || len(conf.Options) != len(tc.want) {
			t.Fatalf("parallelism %d: first document = %+v, want a KwokConfiguration with %v", tc.parallelism, conf, tc.want)
		}
		for k, v := range tc.want {
			if conf.Options[k] != v {
				t.Errorf("parallelism %d: option %s = %v, want %v", tc.parallelism, k, conf.Options[k], v)
			}
		}
		var names []string
		for _, d := range docs[1:] {
			var stage struct {
				Kind     string
				Metadata struct{ Name string }
			}
			if err := yaml.Unmarshal([]byte(d), &stage); err != nil {
				t.Fatal(err)
			}
			if stage.Kind != "Stage" {
				t.Errorf("document kind %q, want Stage", stage.Kind)
			}
			names = append(names, stage.Metadata.Name)
		}
		if got := strings.Join(names, ","); got != "node-initialize,pod-ready,pod-delete" {
			t.Errorf("stages = %s, want node-initialize,pod-ready,pod-delete", got)
		}
	}
}
