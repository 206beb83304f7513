package contract

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestAuditNote(t *testing.T) {
	admitted := AuditNote{
		Container: "vllm", Assigned: "nvidia.com/gpu [GPU-a]", CDI: "[nvidia.com/gpu=GPU-a]",
		Checked: "devices [/dev/nvidia0 195:0] env [NVINJECT_GPU_UUID_0=GPU-a] driver mounts 41/41", Verdict: "admitted [GPU-a]",
	}
	huge := strings.Repeat("é", 5000)
	tests := []struct {
		name  string
		note  AuditNote
		text  string // the exact rendering, when short
		parse AuditNote
	}{
		{name: "admitted", note: admitted,
			text:  "container: vllm; assigned: nvidia.com/gpu [GPU-a]; cdi: [nvidia.com/gpu=GPU-a]; checked: devices [/dev/nvidia0 195:0] env [NVINJECT_GPU_UUID_0=GPU-a] driver mounts 41/41; verdict: admitted [GPU-a]",
			parse: admitted},
		{name: "a refusal's own '; ' stays in the verdict",
			note:  AuditNote{Container: "c", Assigned: "not asked", Verdict: "refused spec-error: a; b; c"},
			text:  "container: c; assigned: not asked; cdi: ; checked: ; verdict: refused spec-error: a; b; c",
			parse: AuditNote{Container: "c", Assigned: "not asked", Verdict: "refused spec-error: a; b; c"}},
		{name: "';' and newlines in earlier fields cannot shift the fields",
			note:  AuditNote{Container: "c", CDI: "x; assigned: y", Checked: "a\nb", Verdict: "refused r: z"},
			text:  "container: c; assigned: ; cdi: x, assigned: y; checked: a b; verdict: refused r: z",
			parse: AuditNote{Container: "c", CDI: "x, assigned: y", Checked: "a b", Verdict: "refused r: z"}},
		{name: "huge fields are cut and counted",
			note: AuditNote{Container: huge, Assigned: huge, CDI: huge, Checked: huge, Verdict: huge}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.note.String()
			if len(s) > MaxAuditNote || !utf8.ValidString(s) {
				t.Fatalf("note is %d bytes (max %d), valid UTF-8 %v", len(s), MaxAuditNote, utf8.ValidString(s))
			}
			if tc.text != "" && s != tc.text {
				t.Errorf("note\n%s\nwant\n%s", s, tc.text)
			}
			got, err := ParseAuditNote(s)
			if err != nil {
				t.Fatal(err)
			}
			if tc.text != "" && got != tc.parse {
				t.Errorf("parsed %+v, want %+v", got, tc.parse)
			}
			if tc.text == "" && (!strings.Contains(got.Verdict, "more bytes)") || !strings.Contains(got.Container, "more bytes)")) {
				t.Errorf("cut fields do not count the cut: %+v", got)
			}
		})
	}
}

func TestParseAuditNoteCombinedAndForeign(t *testing.T) {
	n := AuditNote{Container: "c", Assigned: "a", CDI: "x", Checked: "y", Verdict: "refused gpu-held: z"}
	got, err := ParseAuditNote("(combined from similar events): " + n.String())
	if n.Combined = true; err != nil || got != n {
		t.Errorf("combined note parsed as %+v, %v; want %+v", got, err, n)
	}
	for _, s := range []string{"", "Started container vllm", "container: c; assigned: a", "container: c; x: a; cdi: ; checked: ; verdict: v"} {
		if _, err := ParseAuditNote(s); err == nil || len(err.Error()) > MaxError {
			t.Errorf("ParseAuditNote(%q) = %v, want a bounded error", s, err)
		}
	}
}

func TestCut(t *testing.T) {
	for _, tc := range []struct {
		s    string
		max  int
		want string
	}{
		{"short", 10, "short"},
		{strings.Repeat("a", 40), 30, strings.Repeat("a", 12) + "…(28 more bytes)"},
		{"éééééééééééééééééééé", 25, "ééé…(34 more bytes)"},
		{strings.Repeat("a", 40), 5, ""},
	} {
		got := Cut(tc.s, tc.max)
		if got != tc.want || len(got) > tc.max || !utf8.ValidString(got) {
			t.Errorf("Cut(%q, %d) = %q (%d bytes), want %q", tc.s, tc.max, got, len(got), tc.want)
		}
	}
}

func FuzzParseAuditNote(f *testing.F) {
	f.Add("container: c; assigned: a; cdi: x; checked: y; verdict: admitted", "c", "refused x; y")
	f.Add("(combined from similar events): container: ; assigned: ; cdi: ; checked: ; verdict: ", "", "")
	f.Fuzz(func(t *testing.T, s, field, verdict string) {
		if _, err := ParseAuditNote(s); err != nil && len(err.Error()) > MaxError {
			t.Fatalf("unbounded error: %d bytes", len(err.Error()))
		}
		n := AuditNote{Container: field, Assigned: field, CDI: field, Checked: field, Verdict: verdict}
		text := n.String()
		if len(text) > MaxAuditNote {
			t.Fatalf("note of %d bytes", len(text))
		}
		got, err := ParseAuditNote(text)
		if err != nil {
			t.Fatalf("a note String wrote does not parse: %v", err)
		}
		if got.Assigned != got.CDI || strings.Contains(got.Container+got.Assigned, ";") {
			t.Fatalf("fields shifted: %+v", got)
		}
	})
}
