package gpunode

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/gpunode/nodeconfig"
	"github.com/nvinject/nvinject/shared/cli"
)

// settings is a plugin configuration: the node's group and nothing else.
type settings struct{ nodeconfig.Config }

func loadSettings(args []string, getenv func(string) string, stdout, stderr io.Writer) (settings, error) {
	cmd := cli.New("test", "[flags]", cli.WithOutput(stdout, stderr))
	c := nodeconfig.Register(cmd, nodeconfig.Defaults{})
	if err := cmd.Parse(append([]string{"--node-labels=false"}, args...), getenv); err != nil {
		return settings{}, err
	}
	return settings{*c}, errors.Join(c.Validate()...)
}

// A plugin process: help answered by the loader, a bad log flag a usage
// error, the effective configuration logged, a failure logged and
// returned.
func TestStart(t *testing.T) {
	failed := errors.New("the metrics address is taken")
	for _, tt := range []struct {
		name    string
		args    []string
		runErr  error
		wantErr string
		wantLog []string
	}{
		{name: "help", args: []string{"--help"}, wantErr: "help requested"},
		{name: "bad log level", args: []string{"--log-level=loud"}, wantErr: "loud"},
		{name: "runs", args: []string{"--log-format=text"}, wantLog: []string{"effective configuration", "nvml=real"}},
		{name: "fails", args: []string{"--log-format=text"}, runErr: failed, wantErr: failed.Error(), wantLog: []string{"msg=\"test failed\"", failed.Error()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			ran := false
			err := start(context.Background(), "test", tt.args, func(string) string { return "" }, io.Discard, &stderr, loadSettings,
				func(_ context.Context, cfg settings, _ *slog.Logger, node ...Option) error {
					ran = len(node) == 1
					return tt.runErr
				}, WithRecoverSignal(nil))
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("start = %v; want %q", err, tt.wantErr)
			}
			var usage cli.UsageError
			if tt.name == "bad log level" && !errors.As(err, &usage) {
				t.Errorf("a bad --log-level is %T, want a usage error (exit 2)", err)
			}
			if len(tt.wantLog) > 0 && !ran {
				t.Error("the daemon did not run with the node's options")
			}
			for _, want := range tt.wantLog {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("log lacks %q:\n%s", want, stderr.String())
				}
			}
		})
	}
}
