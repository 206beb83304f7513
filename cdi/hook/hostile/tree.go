package hostile

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Tree records every entry under a directory, by its path below it: mode,
// size, mtime, and content hash or link target. Directory listings are the
// set of keys. The hostile suite and the e2e hostile pod compare a host
// directory's Trees before and after.
type Tree map[string]string

// Snapshot records dir's Tree.
func Snapshot(dir string) (Tree, error) {
	out := Tree{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		v := fmt.Sprintf("%v %d %d", info.Mode(), info.Size(), info.ModTime().UnixNano())
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			v += " -> " + target
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += fmt.Sprintf(" %x", sha256.Sum256(data))
		}
		out[strings.TrimPrefix(p, dir)] = v
		return nil
	})
	return out, err
}

// Changes lists, sorted, what after created, changed or removed of t.
func (t Tree) Changes(after Tree) []string {
	var out []string
	for p, v := range after {
		if w, ok := t[p]; !ok {
			out = append(out, "created "+p)
		} else if w != v {
			out = append(out, "changed "+p)
		}
	}
	for p := range t {
		if _, ok := after[p]; !ok {
			out = append(out, "removed "+p)
		}
	}
	slices.Sort(out)
	return out
}
