package installer

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nvinject/nvinject/deploy"
)

// Defaults for a node's containerd.
const (
	DefaultConfigPath = "/etc/containerd/config.toml"
	DefaultDropInDir  = "/etc/containerd/conf.d"
	DropInName        = "nvinject.toml"
)

// Change is one file Install wrote, or would write in a dry run.
type Change struct {
	Path   string
	Action string // "create" or "update"
	Why    string
	Backup string // previous content, for updates
}

// Installer puts the nvinject drop-in into containerd's configuration.
type Installer struct {
	configPath string
	dropInDir  string
	dropIn     []byte
	dryRun     bool
	log        *slog.Logger
	now        func() time.Time
}

// Option configures an Installer.
type Option func(*Installer)

// WithConfigPath sets containerd's main config (default /etc/containerd/config.toml).
func WithConfigPath(p string) Option { return func(i *Installer) { i.configPath = p } }

// WithDropInDir sets the drop-in directory (default /etc/containerd/conf.d).
func WithDropInDir(d string) Option { return func(i *Installer) { i.dropInDir = d } }

// WithDropIn replaces the embedded deploy/containerd/nvinject.toml.
func WithDropIn(b []byte) Option { return func(i *Installer) { i.dropIn = b } }

// WithDryRun reports the changes without writing anything.
func WithDryRun(on bool) Option { return func(i *Installer) { i.dryRun = on } }

// WithLogger sets where changes are reported.
func WithLogger(l *slog.Logger) Option { return func(i *Installer) { i.log = l } }

// WithClock sets the clock that names backups.
func WithClock(now func() time.Time) Option { return func(i *Installer) { i.now = now } }

// New returns an Installer for the node's default paths unless options say otherwise.
func New(opts ...Option) *Installer {
	i := &Installer{
		configPath: DefaultConfigPath,
		dropInDir:  DefaultDropInDir,
		dropIn:     deploy.ContainerdDropIn,
		log:        slog.Default(),
		now:        time.Now,
	}
	for _, o := range opts {
		o(i)
	}
	return i
}

type plannedWrite struct {
	Change
	content []byte
	mode    fs.FileMode
	exists  bool
}

// Install writes the drop-in and the imports line, each only if needed, and
// returns what changed; none means the node was already set up. Nothing is
// written unless both files can be planned, so a refused config.toml leaves
// the node untouched.
func (i *Installer) Install() ([]Change, error) {
	configPath, err := filepath.Abs(i.configPath)
	if err != nil {
		return nil, fmt.Errorf("resolve --config %q: %w", i.configPath, err)
	}
	dropInDir, err := filepath.Abs(i.dropInDir)
	if err != nil {
		return nil, fmt.Errorf("resolve --dropin-dir %q: %w", i.dropInDir, err)
	}
	dropInPath := filepath.Join(dropInDir, DropInName)

	var plan []plannedWrite
	w, err := planFile(dropInPath, func([]byte, bool) ([]byte, error) { return i.dropIn, nil },
		"nvinject drop-in: runtime handler nvidia, CDI spec dirs, NRI with default validator")
	if err != nil {
		return nil, err
	}
	if w != nil {
		plan = append(plan, *w)
	}
	glob := filepath.Join(dropInDir, "*.toml")
	w, err = planFile(configPath, func(cur []byte, exists bool) ([]byte, error) {
		if !exists {
			return fmt.Appendf(nil, freshConfig, glob), nil
		}
		return mergeImport(cur, configPath, glob, dropInPath)
	}, fmt.Sprintf("imports %q", glob))
	if err != nil {
		return nil, err
	}
	if w != nil {
		plan = append(plan, *w)
	}

	if len(plan) == 0 {
		i.log.Info("no changes: containerd already imports the nvinject drop-in", "config", configPath, "dropin", dropInPath)
		return nil, nil
	}
	changes := make([]Change, 0, len(plan))
	for _, p := range plan {
		if i.dryRun {
			i.log.Info("dry run: would "+p.Action, "path", p.Path, "why", p.Why)
			changes = append(changes, p.Change)
			continue
		}
		c, err := i.write(p)
		if err != nil {
			return changes, err
		}
		i.log.Info(c.Action+"d", "path", c.Path, "why", c.Why, "backup", c.Backup)
		changes = append(changes, c)
	}
	if !i.dryRun {
		i.log.Info("restart containerd to load the new configuration: systemctl restart containerd")
	}
	return changes, nil
}

// planFile computes a file's new content; nil means it is already right.
func planFile(path string, next func(cur []byte, exists bool) ([]byte, error), why string) (*plannedWrite, error) {
	cur, err := os.ReadFile(path)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	want, err := next(cur, exists)
	if err != nil {
		return nil, err
	}
	if exists && bytes.Equal(cur, want) {
		return nil, nil
	}
	w := &plannedWrite{Change: Change{Path: path, Action: "create", Why: why}, content: want, mode: 0o644, exists: exists}
	if exists {
		w.Action = "update"
		if st, err := os.Stat(path); err == nil {
			w.mode = st.Mode().Perm()
		}
	}
	return w, nil
}

// write backs up the old file, then replaces it atomically (temp file,
// fsync, rename), so containerd never reads half a config.
func (i *Installer) write(p plannedWrite) (Change, error) {
	dir := filepath.Dir(p.Path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return p.Change, fmt.Errorf("create %s: %w", dir, err)
	}
	if p.exists {
		p.Backup = fmt.Sprintf("%s.%s.bak", p.Path, i.now().UTC().Format("20060102T150405Z"))
		old, err := os.ReadFile(p.Path)
		if err != nil {
			return p.Change, fmt.Errorf("read %s for backup: %w", p.Path, err)
		}
		if err := atomicWrite(p.Backup, old, p.mode); err != nil {
			return p.Change, fmt.Errorf("back up %s: %w", p.Path, err)
		}
	}
	if err := atomicWrite(p.Path, p.content, p.mode); err != nil {
		return p.Change, fmt.Errorf("write %s: %w", p.Path, err)
	}
	return p.Change, nil
}

func atomicWrite(path string, data []byte, mode fs.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
