//go:build !nosim

package sim

import "time"

func afterMillis(ms uint32) <-chan time.Time {
	return time.After(time.Duration(ms) * time.Millisecond)
}
