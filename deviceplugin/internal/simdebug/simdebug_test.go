package simdebug

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

type fake struct{ xids []uint64 }

func (f *fake) InjectXid(_ string, xid uint64) error { f.xids = append(f.xids, xid); return nil }
func (f *fake) Recover(uuid string) error {
	if uuid != "GPU-a" {
		return errors.New("unknown")
	}
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
		want        int
	}{
		{"POST", "/debug/sim/xid?uuid=GPU-a&xid=79", 200},
		{"POST", "/debug/sim/xid?uuid=GPU-a&xid=x", 400},
		{"GET", "/debug/sim/xid?uuid=GPU-a&xid=79", 405},
		{"POST", "/debug/sim/recover?uuid=GPU-a", 200},
		{"POST", "/debug/sim/recover?uuid=GPU-b", 404},
		{"POST", "/debug/sim/recover", 400},
	} {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(tc.method, tc.url, nil))
		if w.Code != tc.want {
			t.Errorf("%s %s = %d; want %d", tc.method, tc.url, w.Code, tc.want)
		}
	}
	if len(f.xids) != 1 || f.xids[0] != 79 {
		t.Fatalf("injected %v", f.xids)
	}
}
