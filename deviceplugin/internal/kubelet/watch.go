package kubelet

import (
	"path/filepath"
	"sync"

	"github.com/fsnotify/fsnotify"
)

// dirWatch turns file events on kubelet.sock and the plugin's own socket
// into wake-ups of the registration loop. Its goroutine is owned: close
// stops it and waits for it.
type dirWatch struct {
	w    *fsnotify.Watcher
	wake chan struct{}
	done sync.WaitGroup
}

// watchDir watches dir for the named files. The error is why it cannot
// (inotify limits, dir missing); the loop then relies on its poll.
func watchDir(dir string, names ...string) (*dirWatch, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	if err := w.Add(dir); err != nil {
		_ = w.Close()
		return nil, err
	}
	d := &dirWatch{w: w, wake: make(chan struct{}, 1)}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	d.done.Add(1)
	go func() {
		defer d.done.Done()
		for {
			select {
			case e, ok := <-w.Events:
				if !ok {
					return
				}
				if !want[filepath.Base(e.Name)] && !e.Has(fsnotify.Remove) {
					continue
				}
				select {
				case d.wake <- struct{}{}:
				default:
				}
			case _, ok := <-w.Errors:
				if !ok {
					return
				}
				// An overflow may hide an event: wake, the loop stats both.
				select {
				case d.wake <- struct{}{}:
				default:
				}
			}
		}
	}()
	return d, nil
}

func (d *dirWatch) close() {
	_ = d.w.Close()
	d.done.Wait()
}
