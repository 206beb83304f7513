package resolve

import (
	"io/fs"
	"syscall"
)

func stampOf(fi fs.FileInfo) stamp {
	st := stamp{size: fi.Size(), modTime: fi.ModTime()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = sys.Ino
	}
	return st
}
