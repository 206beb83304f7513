package installer

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

// FuzzMergeImport: whatever config.toml holds, mergeImport either refuses
// it or returns TOML that imports the drop-in, keeps every other setting,
// and is a fixed point (a second merge changes nothing).
func FuzzMergeImport(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.toml")
	for _, s := range seeds {
		data, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("version = 3\nimports = [\"a\" , 'b',]\n"))
	f.Add([]byte("version = 3 # v3\nimports = [ # c\n]\n[x]\ny = 1\n"))
	const (
		configPath = "/etc/containerd/config.toml"
		glob       = "/etc/containerd/conf.d/*.toml"
		dropIn     = "/etc/containerd/conf.d/nvinject.toml"
	)
	f.Fuzz(func(t *testing.T, content []byte) {
		out, err := mergeImport(content, configPath, glob, dropIn)
		if err != nil {
			return
		}
		doc := map[string]any{}
		if err := toml.Unmarshal(out, &doc); err != nil {
			t.Fatalf("merged config is not TOML: %v\n%s", err, out)
		}
		imports, err := stringList(doc["imports"])
		if err != nil || !covers(imports, configPath, dropIn) {
			t.Fatalf("merged config does not import the drop-in: %v %v\n%s", imports, err, out)
		}
		again, err := mergeImport(out, configPath, glob, dropIn)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("second merge changed the config (err %v):\n%s\n---\n%s", err, out, again)
		}
	})
}
