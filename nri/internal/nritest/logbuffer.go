//go:build !nosim

package nritest

import (
	"bytes"
	"sync"
)

// LogBuffer is a log sink safe for the goroutines of the code under test.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Take returns what was written since the last Take and forgets it.
func (l *LogBuffer) Take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.b.String()
	l.b.Reset()
	return out
}
