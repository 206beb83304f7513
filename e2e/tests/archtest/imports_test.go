// Package archtest holds the import rules of the whole tree.
package archtest

import (
	"go/build"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/nvinject/nvinject/"

// products are the modules whose packages ship (bin/, the images); e2e is
// equipment.
var products = []string{"shared", "cdi", "gpunode", "deviceplugin", "dra", "doctor", "fleet", "nri", "deploy"}

// daemons are the modules of one program each: none imports another's
// packages; what two of them share lives in shared/, cdi/ or gpunode/.
var daemons = []string{"deviceplugin", "dra", "nri", "doctor", "fleet"}

// simulation are the packages (and their subpackages) of the GPU
// simulation and of the test helpers: equipment that lives beside the
// product it simulates, which a release build (the nosim tag) never links.
var simulation = []string{
	"shared/gpu/sim", "cdi/simulation", "gpunode/simdebug", "nri/internal/simfault", "dra/scalesim",
	"nri/internal/nritest", "gpunode/kubelet/kubelettest", "shared/driverroot/driverroottest",
}

// pkg is one package of the tree as a build with tags sees it.
type pkg struct {
	path    string // below module
	imports []string
}

func walk(t *testing.T, ctx build.Context) []pkg {
	t.Helper()
	var out []pkg
	for _, m := range append(products, "e2e") {
		root := filepath.Join("..", "..", "..", m)
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			if d.Name() == "testdata" || strings.HasPrefix(d.Name(), "_") || strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			p, err := ctx.ImportDir(path, 0)
			if _, none := err.(*build.NoGoError); none {
				return nil
			}
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(filepath.Join("..", "..", ".."), path)
			out = append(out, pkg{path: filepath.ToSlash(rel), imports: p.Imports})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(out) < 100 {
		t.Fatalf("walked %d packages; want the whole tree", len(out))
	}
	return out
}

func under(path string, prefixes []string) bool {
	for _, p := range prefixes {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

func moduleOf(path string) string { m, _, _ := strings.Cut(path, "/"); return m }

func ours(imp string) (string, bool) { return strings.CutPrefix(imp, module) }

func release() build.Context {
	ctx := build.Default
	ctx.BuildTags = []string{"nosim", "nri_no_wasm", "grpcnotrace"}
	ctx.CgoEnabled = true
	return ctx
}

// In a release build no product package imports equipment: nothing under
// e2e/, no simulation package, no test helper. (Test files are not
// looked at: tests may use any equipment.)
func TestProductNeverImportsEquipment(t *testing.T) {
	for _, p := range walk(t, release()) {
		if moduleOf(p.path) == "e2e" || under(p.path, simulation) {
			continue
		}
		for _, imp := range p.imports {
			rel, ok := ours(imp)
			if !ok {
				if strings.HasPrefix(imp, "github.com/NVIDIA/go-nvml/pkg/nvml/mock") {
					t.Errorf("%s imports go-nvml's mock %s in a release build", p.path, imp)
				}
				continue
			}
			if moduleOf(rel) == "e2e" || under(rel, simulation) {
				t.Errorf("%s imports the equipment package %s in a release build; put the use behind the nosim tag or move it to e2e/", p.path, rel)
			}
		}
	}
}

// No daemon's module imports another daemon's packages.
func TestDaemonsDoNotImportEachOther(t *testing.T) {
	ctx := build.Default
	ctx.BuildTags = []string{"nri_no_wasm", "grpcnotrace"}
	for _, p := range walk(t, ctx) {
		from := moduleOf(p.path)
		if !under(from, daemons) {
			continue
		}
		for _, imp := range p.imports {
			rel, ok := ours(imp)
			if to := moduleOf(rel); ok && to != from && under(to, daemons) {
				t.Errorf("%s (daemon %s) imports %s of daemon %s; move what both need to gpunode/, cdi/ or shared/", p.path, from, rel, to)
			}
		}
	}
}
