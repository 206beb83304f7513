package scale

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"
)

// families parses a Prometheus text exposition.
func families(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
}

// Requests counts API requests by verb and resource ("resource/subresource").
type Requests map[string]float64

// requestKey names one verb on one resource.
func requestKey(verb, resource, sub string) string {
	if sub != "" {
		resource += "/" + sub
	}
	return verb + " " + resource
}

// apiRequests sums apiserver_request_total by verb and resource.
func apiRequests(fams map[string]*dto.MetricFamily) Requests {
	out := Requests{}
	f := fams["apiserver_request_total"]
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		l := labels(m)
		out[requestKey(l["verb"], l["resource"], l["subresource"])] += m.GetCounter().GetValue()
	}
	return out
}

// Sub is r minus before, without the keys that did not change.
func (r Requests) Sub(before Requests) Requests {
	out := Requests{}
	for k, v := range r {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// Top is the n largest counts, largest first.
func (r Requests) Top(n int) []RequestCount {
	var out []RequestCount
	for k, v := range r {
		out = append(out, RequestCount{Request: k, Count: int64(v)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Request < out[j].Request
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// Total is the number of requests.
func (r Requests) Total() int64 {
	var t float64
	for _, v := range r {
		t += v
	}
	return int64(t)
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// counter sums a counter or gauge family's samples whose labels include match.
func counter(fams map[string]*dto.MetricFamily, name string, match map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	var sum float64
	for _, m := range f.GetMetric() {
		l := labels(m)
		ok := true
		for k, v := range match {
			ok = ok && l[k] == v
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		}
	}
	return sum
}

// scrapers read the components' /metrics.
type scrapers struct {
	api       rest.Interface
	tls       *http.Client
	scheduler string
	etcd      string
}

func newScrapers(cfg *rest.Config, api rest.Interface, schedulerURL, etcdURL string) (*scrapers, error) {
	tc, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("TLS config from the admin kubeconfig: %w", err)
	}
	// The scheduler serves a self-signed certificate on loopback; the admin client
	// certificate is what it authorizes.
	tc = tc.Clone()
	tc.RootCAs, tc.InsecureSkipVerify = nil, true
	return &scrapers{
		api:       api,
		tls:       &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}},
		scheduler: schedulerURL, etcd: etcdURL,
	}, nil
}

func (s *scrapers) apiServer(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	data, err := s.api.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the API server's /metrics: %w", err)
	}
	return families(strings.NewReader(string(data)))
}

func (s *scrapers) get(ctx context.Context, c *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("read %s: %s: %s", url, resp.Status, body)
	}
	return families(resp.Body)
}

func (s *scrapers) schedulerMetrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	return s.get(ctx, s.tls, s.scheduler+"/metrics")
}

func (s *scrapers) etcdMetrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	return s.get(ctx, http.DefaultClient, s.etcd+"/metrics")
}

// memory reads a process's resident and peak resident set from /proc.
func memory(pid int) (rss, peak int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	return rss, peak, sc.Err()
}
