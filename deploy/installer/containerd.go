// Package installer installs nvinject's containerd drop-in on a node: it
// writes the drop-in and makes /etc/containerd/config.toml import it, without
// touching anything else in that file.
package installer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/nvinject/nvinject/shared/contract"
)

// ErrNeedsMigration marks a config.toml older than version 3.
var ErrNeedsMigration = errors.New("containerd config needs migration to version 3")

// ErrConflict marks a config.toml setting that would silently defeat the
// drop-in (containerd merges a false from a drop-in as "unset").
var ErrConflict = errors.New("containerd config conflicts with the nvinject drop-in")

// freshConfig is written where a node has no config.toml yet.
const freshConfig = `# Written by nvinject-node: containerd defaults plus drop-ins.
version = 3
imports = [%q]
`

// mergeImport returns config.toml's content with the import glob added, or
// the same content when an existing import already covers dropInPath.
// configPath resolves relative imports the way containerd does.
func mergeImport(content []byte, configPath, glob, dropInPath string) ([]byte, error) {
	doc := map[string]any{}
	if err := toml.Unmarshal(content, &doc); err != nil {
		return nil, fmt.Errorf("parse %s: %w; fix the TOML syntax, then rerun", configPath, err)
	}
	if err := checkVersion(doc, configPath); err != nil {
		return nil, err
	}
	if err := checkConflicts(doc, configPath); err != nil {
		return nil, err
	}
	imports, err := stringList(doc["imports"])
	if err != nil {
		return nil, fmt.Errorf("%s: imports: %w; make it a list of strings", configPath, err)
	}
	if err := checkImportsExist(imports, configPath); err != nil {
		return nil, err
	}
	if covers(imports, configPath, dropInPath) {
		return content, nil
	}
	edited, err := addImport(content, glob, doc["imports"] != nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w; add %q to its imports by hand", configPath, err, glob)
	}
	if err := verifyOnlyImportAdded(doc, edited, glob); err != nil {
		return nil, fmt.Errorf("%s: %w; add %q to its imports by hand", configPath, err, glob)
	}
	return edited, nil
}

func checkVersion(doc map[string]any, configPath string) error {
	v, _ := doc["version"].(int64)
	if v == 3 {
		return nil
	}
	if v == 0 {
		v = 1 // containerd reads a config without version as version 1
	}
	return fmt.Errorf("%s is version %d: %w; run `containerd config migrate > config.toml.v3`, review it, "+
		"replace %s with it, restart containerd, then rerun", configPath, v, ErrNeedsMigration, configPath)
}

// checkConflicts finds settings the drop-in cannot override.
func checkConflicts(doc map[string]any, configPath string) error {
	var found []string
	if v, ok := lookup(doc, "plugins", contract.ContainerdNRI, "disable").(bool); ok && v {
		found = append(found, "[plugins.'io.containerd.nri.v1.nri'] disable = true (remove it: the NRI plugin cannot connect)")
	}
	if v, ok := lookup(doc, "plugins", contract.ContainerdCRIRuntime, "enable_cdi").(bool); ok && !v {
		found = append(found, "[plugins.'io.containerd.cri.v1.runtime'] enable_cdi = false (remove it: GPU containers need CDI)")
	}
	if len(found) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %w: %s", configPath, ErrConflict, strings.Join(found, "; "))
}

// checkImportsExist refuses a plain import that names a missing file:
// containerd stops reading imports there and starts without the ones after
// it (verified with containerd 2.2.9 `config dump`), so the drop-in would
// silently not apply.
func checkImportsExist(imports []string, configPath string) error {
	for _, imp := range imports {
		if strings.Contains(imp, "*") {
			continue
		}
		p := imp
		if !filepath.IsAbs(p) {
			p = filepath.Join(filepath.Dir(configPath), p)
		}
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s: %w: imports %q, which is missing (%v); containerd skips every import after it: create it or remove it from imports", configPath, ErrConflict, imp, err)
		}
	}
	return nil
}

func lookup(doc map[string]any, keys ...string) any {
	var cur any = doc
	for _, k := range keys {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}

func stringList(v any) ([]string, error) {
	if v == nil {
		return nil, nil
	}
	items, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("is %T, not a list", v)
	}
	out := make([]string, 0, len(items))
	for _, it := range items {
		s, ok := it.(string)
		if !ok {
			return nil, fmt.Errorf("has a %T item", it)
		}
		out = append(out, s)
	}
	return out, nil
}

// covers reports whether containerd would load dropInPath from imports.
func covers(imports []string, configPath, dropInPath string) bool {
	for _, imp := range imports {
		imp = filepath.Clean(imp)
		if !filepath.IsAbs(imp) {
			imp = filepath.Join(filepath.Dir(configPath), imp)
		}
		if imp == dropInPath {
			return true
		}
		if ok, err := filepath.Match(imp, dropInPath); err == nil && ok && strings.Contains(imp, "*") {
			return true
		}
	}
	return false
}

var (
	versionLine  = regexp.MustCompile(`(?m)^[ \t]*version[ \t]*=[ \t]*3[ \t]*(#.*)?(\r?\n|$)`)
	importsStart = regexp.MustCompile(`(?m)^[ \t]*imports[ \t]*=[ \t]*\[`)
)

// addImport edits the text so comments and layout survive: a new imports
// line after `version = 3`, or the glob appended to the existing array.
func addImport(content []byte, glob string, hasImports bool) ([]byte, error) {
	quoted := fmt.Sprintf("%q", glob)
	if !hasImports {
		loc := versionLine.FindIndex(content)
		if loc == nil {
			return nil, errors.New("no top-level `version = 3` line to put imports after")
		}
		line := "imports = [" + quoted + "]\n"
		if loc[1] > 0 && content[loc[1]-1] != '\n' {
			line = "\n" + line
		}
		return slices.Concat(content[:loc[1]], []byte(line), content[loc[1]:]), nil
	}
	loc := importsStart.FindIndex(content)
	if loc == nil {
		return nil, errors.New("imports is not written as `imports = [...]` on its own line")
	}
	end, empty, err := arrayEnd(content, loc[1])
	if err != nil {
		return nil, err
	}
	insert := ", " + quoted
	if empty {
		insert = quoted
	}
	return slices.Concat(content[:end], []byte(insert), content[end:]), nil
}

// arrayEnd finds where to insert into the array whose body starts at from:
// right after its last item or comma, so comments and the closing bracket's
// layout stay put. empty tells whether a comma must precede the new item.
func arrayEnd(content []byte, from int) (at int, empty bool, err error) {
	at, empty = from, true
	var quote byte
	for i := from; i < len(content); i++ {
		c := content[i]
		switch {
		case quote != 0:
			if c == '\\' && quote == '"' {
				i++
			} else if c == quote {
				quote, at = 0, i+1
			}
		case c == '"' || c == '\'':
			quote, empty = c, false
		case c == '#':
			for i < len(content) && content[i] != '\n' {
				i++
			}
		case c == ',':
			empty, at = true, i+1
		case c == ']':
			return at, empty, nil
		}
	}
	return 0, false, errors.New("imports array is not closed")
}

// verifyOnlyImportAdded re-parses the edit: it must equal the original
// document with the glob appended to imports and nothing else.
func verifyOnlyImportAdded(orig map[string]any, edited []byte, glob string) error {
	got := map[string]any{}
	if err := toml.Unmarshal(edited, &got); err != nil {
		return fmt.Errorf("adding the import broke the TOML (%v)", err)
	}
	want := map[string]any{}
	for k, v := range orig {
		want[k] = v
	}
	imports, _ := orig["imports"].([]any)
	want["imports"] = append(slices.Clone(imports), glob)
	if !reflect.DeepEqual(got, want) {
		return errors.New("adding the import would change other settings")
	}
	return nil
}
