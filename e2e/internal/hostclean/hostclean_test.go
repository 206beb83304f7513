package hostclean

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", "/plain": "/plain", `/t\011x`: "/t\tx"} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMountsUnderNothing(t *testing.T) {
	mounts, err := MountsUnder(t.TempDir())
	if err != nil || len(mounts) != 0 {
		t.Errorf("MountsUnder(fresh dir) = %v, %v", mounts, err)
	}
}
