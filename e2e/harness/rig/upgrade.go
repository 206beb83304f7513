package rig

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// StageDriverUpgrade writes node n's next driver root (drv, with n's SIMULATED
// GPUs) beside its live one and returns the shell command that switches the live
// root to it in place, as a package manager upgrades a driver: the new files
// replace the old ones by new inodes (cp --remove-destination), then the files only
// the old driver had are removed. A running container keeps the files it was given
// (its bind mounts hold the old inodes); nvinject's daemons notice the new version
// and restart on it.
func (d *Deployer) StageDriverUpgrade(ctx context.Context, n FleetNode, drv Driver) (string, error) {
	live := d.DriverRootOf(n.Name)
	stage := live + ".next"
	if err := os.RemoveAll(stage); err != nil {
		return "", err
	}
	if err := d.writeDriverRootAt(ctx, stage, n.NVML, drv); err != nil {
		return "", fmt.Errorf("stage the next driver root of %s: %w", n.Name, err)
	}
	old, err := relPaths(live)
	if err != nil {
		return "", err
	}
	next, err := relPaths(stage)
	if err != nil {
		return "", err
	}
	// A path that is a directory in one root and not in the other (trixie's merged-/usr
	// lib -> usr/lib over bookworm's lib/) is replaced whole before the copy.
	var replaced, gone []string
	for p, dir := range old {
		if nextDir, ok := next[p]; ok && nextDir != dir {
			replaced = append(replaced, p)
		}
	}
	under := func(p string) bool {
		for _, r := range replaced {
			if strings.HasPrefix(p, r+"/") {
				return true
			}
		}
		return false
	}
	for p := range old {
		if _, ok := next[p]; !ok && !under(p) {
			gone = append(gone, p)
		}
	}
	var rm strings.Builder
	for _, p := range replaced {
		fmt.Fprintf(&rm, "rm -rf %s\n", filepath.Join(live, p))
	}
	// Deepest first, so a directory is empty when its turn comes.
	sort.Sort(sort.Reverse(sort.StringSlice(gone)))
	list := stage + ".gone"
	if err := os.WriteFile(list, []byte(strings.Join(gone, "\n")+"\n"), 0o644); err != nil {
		return "", err
	}
	script := stage + ".sh"
	body := fmt.Sprintf(`#!/bin/sh
# Switches %[4]s's driver root %[1]s to the driver staged in %[2]s, in place.
set -eu
%[5]scp -a --remove-destination %[2]s/. %[1]s/
while IFS= read -r p; do
	[ -n "$p" ] || continue
	if [ -d "%[1]s/$p" ] && [ ! -L "%[1]s/$p" ]; then rmdir "%[1]s/$p" 2>/dev/null || true; else rm -f "%[1]s/$p"; fi
done < %[3]s
rm -rf %[2]s %[3]s
echo "driver root of %[4]s switched in place: $(ls %[1]s/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.*.* 2>/dev/null | head -1)"
`, live, stage, list, n.Name, rm.String())
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		return "", err
	}
	return "sh " + script, nil
}

// relPaths lists every path under root, relative to it, and whether it is a
// directory (a link to one is not).
func relPaths(root string) (map[string]bool, error) {
	out := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root {
			rel, _ := filepath.Rel(root, p)
			out[rel] = e.IsDir()
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list driver root %s: %w", root, err)
	}
	return out, nil
}
