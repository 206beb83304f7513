package promtext

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const exposition = `# HELP nvinject_nri_refusals_total Container creations refused, by reason.
# TYPE nvinject_nri_refusals_total counter
nvinject_nri_refusals_total{reason="unresolvable"} 2
nvinject_nri_refusals_total{reason="runtime-class"} 1
# TYPE nvinject_nri_connected gauge
nvinject_nri_connected 1
# TYPE lat histogram
lat_bucket{le="1"} 3
lat_bucket{le="+Inf"} 4
lat_sum 2
lat_count 4
`

func TestParse(t *testing.T) {
	f, err := Parse(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		want *float64
	}{
		{"nvinject_nri_refusals_total", ptr(3)},
		{"nvinject_nri_connected", ptr(1)},
		{"lat", ptr(4)},
		{"absent_metric", nil},
	}
	for _, tt := range tests {
		got := f.Sum(tt.name)
		if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
			t.Errorf("Sum(%s) = %v, want %v", tt.name, deref(got), deref(tt.want))
		}
	}
	if got := f.SumWhere("nvinject_nri_refusals_total", "reason", "unresolvable"); got == nil || *got != 2 {
		t.Errorf("SumWhere(reason=unresolvable) = %v, want 2", deref(got))
	}
	if got := f.SumWhere("absent_metric", "reason", "x"); got != nil {
		t.Errorf("SumWhere(absent) = %v, want nil", *got)
	}
	if l := f["nvinject_nri_refusals_total"][0].Labels["reason"]; l != "unresolvable" && l != "runtime-class" {
		t.Errorf("label reason = %q", l)
	}
}

func TestFetch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(exposition))
	}))
	defer srv.Close()
	tests := []struct {
		url     string
		wantErr string
	}{
		{srv.URL + "/metrics", ""},
		{srv.URL + "/nope", "404"},
		{"http://127.0.0.1:1/metrics", "is the daemon running"},
	}
	for _, tt := range tests {
		f, err := Fetch(context.Background(), srv.Client(), tt.url)
		if tt.wantErr == "" {
			if err != nil || f.Sum("nvinject_nri_connected") == nil {
				t.Errorf("Fetch(%s) = %v, %v", tt.url, f, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("Fetch(%s) error = %v, want %q", tt.url, err, tt.wantErr)
		}
	}
}

func ptr(v float64) *float64 { return &v }

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}
