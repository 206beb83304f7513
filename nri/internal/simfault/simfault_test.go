package simfault

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

type fake struct {
	delay time.Duration
	away  time.Duration
	fail  bool
}

func (f *fake) SetDelay(d time.Duration) { f.delay = d }
func (f *fake) Reconnect(d time.Duration) error {
	if f.fail {
		return errors.New("not connected")
	}
	f.away = d
	return nil
}

func TestRoutes(t *testing.T) {
	f := &fake{}
	mux := http.NewServeMux()
	for p, h := range Routes(f, f) {
		mux.Handle(p, h)
	}
	for _, tc := range []struct {
		method, url string
		fail        bool
		code        int
	}{
		{"POST", "/debug/sim/delay?d=3s", false, 200},
		{"POST", "/debug/sim/delay?d=-1s", false, 400},
		{"POST", "/debug/sim/delay", false, 400},
		{"GET", "/debug/sim/delay?d=1s", false, 405},
		{"POST", "/debug/sim/disconnect?for=2s", false, 200},
		{"POST", "/debug/sim/disconnect?for=2s", true, 409},
	} {
		f.fail = tc.fail
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.url, nil))
		if rec.Code != tc.code {
			t.Errorf("%s %s = %d, want %d", tc.method, tc.url, rec.Code, tc.code)
		}
	}
	if f.delay != 3*time.Second || f.away != 2*time.Second {
		t.Errorf("delay %s away %s, want 3s and 2s", f.delay, f.away)
	}
}
