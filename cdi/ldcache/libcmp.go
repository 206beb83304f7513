package ldcache

import (
	"cmp"
	"slices"
	"strings"
)

// Libcmp compares two library names as glibc's _dl_cache_libcmp does:
// digit runs compare by their value (libfoo.so.10 > libfoo.so.9), a digit
// sorts above any other byte, other bytes compare as C's signed char.
// Names with a digit run of more than MaxDigitRun digits are not compared
// reliably (glibc's int overflows): Indexable refuses them.
func Libcmp(a, b string) int {
	i, j := 0, 0
	for i < len(a) {
		switch {
		case isDigit(a[i]) && j < len(b) && isDigit(b[j]):
			var va, vb int64
			for ; i < len(a) && isDigit(a[i]); i++ {
				va = va*10 + int64(a[i]-'0')
			}
			for ; j < len(b) && isDigit(b[j]); j++ {
				vb = vb*10 + int64(b[j]-'0')
			}
			if va != vb {
				return cmp.Compare(va, vb)
			}
		case isDigit(a[i]):
			return 1
		case j < len(b) && isDigit(b[j]):
			return -1
		case j >= len(b) || a[i] != b[j]:
			return cmp.Compare(int8(a[i]), at(b, j))
		default:
			i++
			j++
		}
	}
	return cmp.Compare(0, at(b, j))
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// at is C's *p for b at j: the byte as a signed char, 0 past the end.
func at(b string, j int) int8 {
	if j >= len(b) {
		return 0
	}
	return int8(b[j])
}

// MaxDigitRun is the longest digit run Libcmp compares as glibc does
// (999999999 fits glibc's int).
const MaxDigitRun = 9

// Indexable reports whether name can be a cache key the loader finds: a
// file name (no '/', not empty, at most 255 bytes, no NUL) whose digit
// runs are short enough for glibc's comparison to be a total order.
func Indexable(name string) bool {
	if name == "" || name == "." || name == ".." || len(name) > 255 || strings.ContainsAny(name, "/\x00") {
		return false
	}
	run := 0
	for i := range len(name) {
		if run = run + 1; !isDigit(name[i]) {
			run = 0
		}
		if run > MaxDigitRun {
			return false
		}
	}
	return true
}

// Sort puts entries in the order glibc's ldconfig writes them and the
// loader's binary search expects: names descending by Libcmp; for one
// name, flags descending, glibc-hwcaps entries first (by subdirectory
// name), then the others; otherwise the order given (the first directory
// listed wins, as the loader takes the first usable entry).
func Sort(entries []Entry) {
	slices.SortStableFunc(entries, func(a, b Entry) int {
		if c := Libcmp(b.Name, a.Name); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Flags, a.Flags); c != 0 {
			return c
		}
		switch {
		case a.HWCaps != "" && b.HWCaps == "":
			return -1
		case a.HWCaps == "" && b.HWCaps != "":
			return 1
		}
		return strings.Compare(a.HWCaps, b.HWCaps)
	})
}
