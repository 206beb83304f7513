package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestFlagsAndErr(t *testing.T) {
	var f Flags
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	f.Register(fs, JSON)
	if err := fs.Parse([]string{"--log-level=debug"}); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	log, err := f.Logger(&b)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("boom", Err(errors.New(strings.Repeat("x", 1<<20))))
	var line map[string]any
	if err := json.Unmarshal(b.Bytes(), &line); err != nil {
		t.Fatalf("not one JSON line: %v", err)
	}
	if s, _ := line["error"].(string); len(s) > 1100 || !strings.Contains(s, "more bytes") {
		t.Errorf("error not bounded: %d bytes", len(s))
	}
	for _, bad := range [][2]string{{"xml", "info"}, {"text", "loud"}} {
		if _, err := New(&b, bad[0], bad[1]); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
