package injbench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// pluginCounters are the nvinject-nri metrics read around each container.
type pluginCounters struct {
	injections float64
	// handlerSeconds is the summed CreateContainer handler time.
	handlerSeconds float64
	handlerCalls   uint64
}

// sub is the change from before to c.
func (c pluginCounters) sub(before pluginCounters) (injections float64, handler time.Duration, calls uint64) {
	return c.injections - before.injections,
		time.Duration((c.handlerSeconds - before.handlerSeconds) * float64(time.Second)),
		c.handlerCalls - before.handlerCalls
}

func scrape(ctx context.Context, url string) (pluginCounters, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return pluginCounters{}, fmt.Errorf("metrics URL %q: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return pluginCounters{}, fmt.Errorf("GET %s (is nvinject-nri still running?): %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return pluginCounters{}, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseCounters(resp.Body)
}

func parseCounters(r io.Reader) (pluginCounters, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return pluginCounters{}, fmt.Errorf("parse nvinject-nri metrics: %w", err)
	}
	var c pluginCounters
	for _, m := range mfs["nvinject_nri_injections_total"].GetMetric() {
		c.injections += m.GetCounter().GetValue()
	}
	for _, m := range mfs["nvinject_nri_create_container_seconds"].GetMetric() {
		c.handlerSeconds += m.GetHistogram().GetSampleSum()
		c.handlerCalls += m.GetHistogram().GetSampleCount()
	}
	return c, nil
}
