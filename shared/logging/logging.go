// Package logging builds the one structured logger style every nvinject
// binary uses: slog with snake_case keys and errors under "error", JSON by
// default for the daemons (machines read their logs), text for the tools a
// person runs; --log-format switches either.
package logging

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/nvinject/nvinject/shared/contract"
)

// Formats.
const (
	JSON = "json"
	Text = "text"
)

// New returns a slog.Logger writing format ("json" or "text") at level
// ("debug", "info", "warn", "error").
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level=%q is not valid; use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case JSON:
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case Text, "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format=%q is not valid; use json or text", format)
	}
}

// Flags are the logging flags of a binary.
type Flags struct {
	Format string
	Level  string
}

// Register defines --log-format (default defaultFormat) and --log-level.
func (f *Flags) Register(fs *flag.FlagSet, defaultFormat string) {
	fs.StringVar(&f.Format, "log-format", defaultFormat, "log format: json or text")
	fs.StringVar(&f.Level, "log-level", "info", "log level: debug, info, warn or error")
}

// Logger builds the logger the flags ask for.
func (f Flags) Logger(w io.Writer) (*slog.Logger, error) { return New(w, f.Format, f.Level) }

// Err is the one way an error goes into a log line: key "error", text
// bounded (contract.Bound), so a huge input cannot make a huge line.
func Err(err error) slog.Attr {
	if err == nil {
		return slog.String("error", "")
	}
	return slog.String("error", contract.Bound(err).Error())
}
