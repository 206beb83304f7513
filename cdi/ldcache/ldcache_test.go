package ldcache

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	in := []Entry{
		{Flags: FlagELFLibc6 | FlagX8664, Name: "libcuda.so.1", Path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
		{Flags: FlagELFLibc6, Name: "libcuda.so.1", Path: "/usr/lib/i386-linux-gnu/libcuda.so.1"},
		{Flags: FlagELFLibc6 | FlagX8664, Name: "libc.so.6", Path: "/lib/glibc-hwcaps/x86-64-v3/libc.so.6", HWCaps: "x86-64-v3"},
	}
	got, err := Parse(Marshal(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(in) {
		t.Fatalf("got %d entries, want %d", len(got), len(in))
	}
	for i := range in {
		if got[i] != in[i] {
			t.Errorf("entry %d = %+v, want %+v", i, got[i], in[i])
		}
	}
	if got[0].Arch() != FlagX8664 || got[1].Arch() != 0 {
		t.Errorf("arch bits = %#x, %#x", got[0].Arch(), got[1].Arch())
	}
}

// The host's own cache is written by the real ldconfig: reading it proves
// the parser matches glibc, not just our writer.
func TestParseHostCache(t *testing.T) {
	data, err := os.ReadFile("/etc/ld.so.cache")
	if err != nil {
		t.Skipf("no host ld.so.cache: %v", err)
	}
	entries, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name == "libc.so.6" && strings.HasSuffix(e.Path, "/libc.so.6") {
			return
		}
	}
	t.Fatalf("libc.so.6 not among %d entries of the host cache", len(entries))
}

func TestParseRejects(t *testing.T) {
	good := Marshal([]Entry{{Name: "a", Path: "/a"}})
	for name, data := range map[string][]byte{
		"empty":     nil,
		"no magic":  []byte("ld.so-1.7.0 garbage"),
		"truncated": good[:30],
		"too many":  append(append([]byte{}, good[:20]...), append([]byte{0xff, 0xff, 0, 0}, good[24:]...)...),
		"bad offset": func() []byte {
			b := append([]byte{}, good...)
			b[headerSize+4] = 0xff
			b[headerSize+5] = 0xff
			return b
		}(),
	} {
		if _, err := Parse(data); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", name, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(Marshal([]Entry{{Flags: 0x303, Name: "libnvidia-ml.so.1", Path: "/usr/lib/libnvidia-ml.so.1"}}))
	f.Add([]byte(magic))
	f.Add(MarshalGenerated([]Entry{{Flags: 0x303, Name: "libc.so.6", Path: "/lib/glibc-hwcaps/x86-64-v3/libc.so.6", HWCaps: "x86-64-v3"}}, "gen"))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := Parse(data)
		if err != nil {
			return
		}
		again, err := Parse(Marshal(entries))
		if err != nil || !slices.Equal(again, entries) {
			t.Fatalf("re-marshalled cache does not parse back: %v", err)
		}
	})
}
