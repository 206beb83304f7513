// Package ldcache reads and writes glibc's /etc/ld.so.cache ("glibc-ld.so.cache1.1"
// format). The CDI generator uses it to find a driver root's libraries the
// way the dynamic loader would; the simulated driver root writes one.
package ldcache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

const (
	magic      = "glibc-ld.so.cache1.1"
	headerSize = 48
	entrySize  = 24
)

// Flags of an entry: ELF libc6 plus the ABI of the library.
const (
	FlagELFLibc6 = 0x0003
	FlagX8664    = 0x0300
	FlagAArch64  = 0x0a00
	flagArchMask = 0x0f00
)

// Entry maps a library's soname to its path.
type Entry struct {
	Flags int32
	Name  string
	Path  string
}

// Arch returns the entry's ABI bits.
func (e Entry) Arch() int32 { return e.Flags & flagArchMask }

// ErrFormat marks a file that is not a readable ld.so.cache.
var ErrFormat = errors.New("not a glibc ld.so.cache (format 1.1)")

// Parse reads the entries of an ld.so.cache. Files in the old combined
// format are read through their embedded new-format table.
func Parse(data []byte) ([]Entry, error) {
	start := bytes.Index(data, []byte(magic))
	if start < 0 {
		return nil, ErrFormat
	}
	hdr := data[start:]
	if len(hdr) < headerSize {
		return nil, fmt.Errorf("%w: header truncated", ErrFormat)
	}
	le := binary.LittleEndian
	n := le.Uint32(hdr[20:24])
	if uint64(n)*entrySize > uint64(len(hdr)-headerSize) {
		return nil, fmt.Errorf("%w: %d entries do not fit in %d bytes", ErrFormat, n, len(hdr))
	}
	out := make([]Entry, 0, n)
	for i := uint32(0); i < n; i++ {
		e := hdr[headerSize+int(i)*entrySize:]
		key, err := cstring(hdr, le.Uint32(e[4:8]))
		if err != nil {
			return nil, err
		}
		val, err := cstring(hdr, le.Uint32(e[8:12]))
		if err != nil {
			return nil, err
		}
		out = append(out, Entry{Flags: int32(le.Uint32(e[0:4])), Name: key, Path: val})
	}
	return out, nil
}

func cstring(b []byte, off uint32) (string, error) {
	if uint64(off) >= uint64(len(b)) {
		return "", fmt.Errorf("%w: string offset %d outside the file", ErrFormat, off)
	}
	end := bytes.IndexByte(b[off:], 0)
	if end < 0 {
		return "", fmt.Errorf("%w: unterminated string at %d", ErrFormat, off)
	}
	return string(b[off : int(off)+end]), nil
}

// Marshal writes entries as a new-format ld.so.cache.
func Marshal(entries []Entry) []byte {
	le := binary.LittleEndian
	var strs bytes.Buffer
	strBase := uint32(headerSize + len(entries)*entrySize)
	offs := make([][2]uint32, len(entries))
	for i, e := range entries {
		offs[i][0] = strBase + uint32(strs.Len())
		strs.WriteString(e.Name)
		strs.WriteByte(0)
		offs[i][1] = strBase + uint32(strs.Len())
		strs.WriteString(e.Path)
		strs.WriteByte(0)
	}
	out := make([]byte, headerSize+len(entries)*entrySize, int(strBase)+strs.Len())
	copy(out, magic)
	le.PutUint32(out[20:24], uint32(len(entries)))
	le.PutUint32(out[24:28], uint32(strs.Len()))
	out[28] = 2 // little-endian, as glibc records it
	for i, e := range entries {
		p := out[headerSize+i*entrySize:]
		le.PutUint32(p[0:4], uint32(e.Flags))
		le.PutUint32(p[4:8], offs[i][0])
		le.PutUint32(p[8:12], offs[i][1])
	}
	return append(out, strs.Bytes()...)
}
