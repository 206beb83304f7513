package doctor

import (
	"go/build"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/nvinject/nvinject/doctor"

// pure are the only packages outside the doctor that evidence and check may
// import: formatting and data, no files, sockets, processes or API server.
var pure = []string{"fmt", "maps", "regexp", "slices", "strconv", "strings", "time", "github.com/nvinject/nvinject/shared/contract"}

// pipeline is the doctor packages each doctor package may import (paths
// below the module; "" is package doctor). The graph is the pipeline:
// collect → evidence → check → render, wired by package doctor and the
// command; I/O helpers only under collect.
var pipeline = map[string]struct {
	imports []string
	// pure: its imports from outside the doctor are in pure.
	pure bool
}{
	"evidence":            {pure: true},
	"check":               {imports: []string{"evidence"}, pure: true},
	"collect":             {imports: []string{"ctrdconfig", "evidence", "kubeexec", "promtext", "smi"}},
	"render":              {imports: []string{"check"}},
	"":                    {imports: []string{"check", "collect", "render"}},
	"cmd/nvinject-doctor": {imports: []string{"", "check", "collect", "fleet", "render"}},
	// fleet reads the API server for every node's row and writes the rows.
	"fleet":      {},
	"ctrdconfig": {},
	"kubeexec":   {},
	"promtext":   {},
	"smi":        {},
}

// TestPipelineImports holds the doctor's packages to the pipeline doc.go
// draws: evidence imports no doctor package, check only evidence, collect
// no check or render, render no collector; evidence and check do no I/O.
// A new package needs its row in pipeline.
func TestPipelineImports(t *testing.T) {
	seen := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if d.Name() == "testdata" {
			return filepath.SkipDir
		}
		pkg, err := build.ImportDir(path, 0)
		if _, none := err.(*build.NoGoError); none {
			return nil
		}
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(filepath.ToSlash(path), ".")
		name := strings.TrimSuffix(module+"/"+rel, "/")
		rule, ok := pipeline[rel]
		if !ok {
			t.Errorf("package %s has no row in pipeline: say which doctor packages it may import", name)
			return nil
		}
		seen[rel] = true
		for _, imp := range pkg.Imports {
			if dep, inDoctor := doctorPackage(imp); inDoctor {
				if !slices.Contains(rule.imports, dep) {
					t.Errorf("%s imports %s; the pipeline lets it import only %q", name, imp, rule.imports)
				}
				continue
			}
			if rule.pure && !slices.Contains(pure, imp) {
				t.Errorf("%s imports %s; it must stay pure (no I/O), importing only %q", name, imp, pure)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for rel := range pipeline {
		if !seen[rel] {
			t.Errorf("pipeline has a row for %q, which is no package", rel)
		}
	}
}

// doctorPackage is imp's path below the module, and whether it is in it.
func doctorPackage(imp string) (string, bool) {
	if imp == module {
		return "", true
	}
	rel, ok := strings.CutPrefix(imp, module+"/")
	return rel, ok
}
