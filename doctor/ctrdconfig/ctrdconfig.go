// Package ctrdconfig reads a containerd configuration the way containerd
// does for the keys the doctor needs: the main file plus its imports
// (globs, relative to the importing file), tables merged deeply and arrays
// replaced by later files.
package ctrdconfig

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/pelletier/go-toml/v2"

	"github.com/nvinject/nvinject/shared/contract"
)

// Config is what the doctor needs from containerd's configuration.
type Config struct {
	// Files are the files read, main file first.
	Files []string
	// Handlers are the CRI runtime handler names (RuntimeClass handlers).
	Handlers []string
	// CDISpecDirs is cdi_spec_dirs when set; empty means containerd's
	// default (/etc/cdi, /var/run/cdi).
	CDISpecDirs []string
	// NRIDisabled is set when the NRI plugin is explicitly disabled.
	NRIDisabled bool
}

// criPlugins are the CRI runtime plugin's names in config version 3
// (containerd 2.x) and version 2 (containerd 1.7).
var criPlugins = []string{contract.ContainerdCRIRuntime, contract.ContainerdCRILegacy}

const nriPlugin = contract.ContainerdNRI

// Load reads path and everything it imports.
func Load(path string) (Config, error) {
	merged := map[string]any{}
	var files []string
	if err := load(path, merged, &files); err != nil {
		return Config{}, err
	}
	c := Config{Files: files}
	plugins, _ := merged["plugins"].(map[string]any)
	for _, name := range criPlugins {
		cri, _ := plugins[name].(map[string]any)
		ctrd, _ := cri["containerd"].(map[string]any)
		runtimes, _ := ctrd["runtimes"].(map[string]any)
		for h := range runtimes {
			if !slices.Contains(c.Handlers, h) {
				c.Handlers = append(c.Handlers, h)
			}
		}
		if dirs, ok := cri["cdi_spec_dirs"].([]any); ok {
			c.CDISpecDirs = c.CDISpecDirs[:0]
			for _, d := range dirs {
				if s, ok := d.(string); ok {
					c.CDISpecDirs = append(c.CDISpecDirs, filepath.Clean(s))
				}
			}
		}
	}
	slices.Sort(c.Handlers)
	if nri, ok := plugins[nriPlugin].(map[string]any); ok {
		c.NRIDisabled, _ = nri["disable"].(bool)
	}
	return c, nil
}

func load(path string, into map[string]any, files *[]string) error {
	if slices.Contains(*files, path) {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read containerd config %s (pass --containerd-config): %w", path, err)
	}
	var doc map[string]any
	if err := toml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("parse containerd config %s: %w", path, err)
	}
	*files = append(*files, path)
	imports, _ := doc["imports"].([]any)
	delete(doc, "imports")
	merge(into, doc)
	for _, imp := range imports {
		pattern, ok := imp.(string)
		if !ok {
			continue
		}
		if !filepath.IsAbs(pattern) {
			pattern = filepath.Join(filepath.Dir(path), pattern)
		}
		matches, err := filepath.Glob(pattern)
		if err != nil {
			return fmt.Errorf("containerd config %s: import %q: %w", path, pattern, err)
		}
		slices.Sort(matches)
		for _, m := range matches {
			if err := load(m, into, files); err != nil {
				return err
			}
		}
	}
	return nil
}

// merge copies src into dst: tables merge deeply, anything else replaces.
func merge(dst, src map[string]any) {
	for k, v := range src {
		sv, sok := v.(map[string]any)
		dv, dok := dst[k].(map[string]any)
		if sok && dok {
			merge(dv, sv)
			continue
		}
		dst[k] = v
	}
}
