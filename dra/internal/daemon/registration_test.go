package daemon

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nvinject/nvinject/dra/internal/config"
)

// kubelet's registration status flips readiness, except a refusal of a
// repeated registration, which leaves the earlier one in force.
func TestRegistrationStatus(t *testing.T) {
	ok := &registerapi.RegistrationStatus{PluginRegistered: true}
	repeated := &registerapi.RegistrationStatus{Error: "endpoint /var/lib/kubelet/plugins/gpu.nvinject.io/dra.sock already registered for DRA driver plugin gpu.nvinject.io"}
	refused := &registerapi.RegistrationStatus{Error: "version 9 not supported"}
	for _, tc := range []struct {
		name      string
		statuses  []*registerapi.RegistrationStatus
		ready     bool
		gaugeWant float64
	}{
		{"registered", []*registerapi.RegistrationStatus{ok}, true, 1},
		{"a repeated registration refused keeps the first", []*registerapi.RegistrationStatus{ok, repeated}, true, 1},
		{"refused", []*registerapi.RegistrationStatus{ok, refused}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New(config.Config{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			m := newMetrics(prometheus.NewRegistry())
			seen := d.registrationSeen(m)
			for _, st := range tc.statuses {
				if _, err := seen(context.Background(), st, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) { return &registerapi.RegistrationStatusResponse{}, nil }); err != nil {
					t.Fatal(err)
				}
			}
			if got := d.ready.Ready() == nil; got != tc.ready {
				t.Errorf("ready = %v (%v), want %v", got, d.ready.Ready(), tc.ready)
			}
			if got := testutil.ToFloat64(m.registered); got != tc.gaugeWant {
				t.Errorf("registered gauge = %v, want %v", got, tc.gaugeWant)
			}
		})
	}
}
