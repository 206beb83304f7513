package contract

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxQuoted is the longest value an error message or log line quotes: the
// rest is cut and counted, so input of any size gives a bounded message.
const MaxQuoted = 200

// MaxListed is how many names an error message lists before counting the rest.
const MaxListed = 4

// Quote returns s quoted, cut to MaxQuoted bytes with the cut counted.
func Quote(s string) string {
	if len(s) <= MaxQuoted {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s…(%d more bytes)", strconv.Quote(s[:MaxQuoted]), len(s)-MaxQuoted)
}

// List renders names as [a b c …and N more], each cut like Quote, at most
// MaxListed of them.
func List(names []string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, n := range names {
		if i == MaxListed {
			fmt.Fprintf(&b, " …and %d more", len(names)-MaxListed)
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		if len(n) > MaxQuoted {
			n = Quote(n)
		}
		b.WriteString(n)
	}
	b.WriteByte(']')
	return b.String()
}

// MaxError is the longest error text Bound lets through.
const MaxError = 1024

// Bound returns err with its text cut to MaxError bytes (the cut counted);
// errors.Is and errors.As still see err. Use it where an error quotes input.
func Bound(err error) error {
	if err == nil || len(err.Error()) <= MaxError {
		return err
	}
	return boundedError{err}
}

type boundedError struct{ err error }

func (b boundedError) Error() string {
	s := b.err.Error()
	return fmt.Sprintf("%s…(%d more bytes)", s[:MaxError], len(s)-MaxError)
}

func (b boundedError) Unwrap() error { return b.err }
