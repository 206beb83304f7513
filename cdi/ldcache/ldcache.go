// Package ldcache reads and writes glibc's /etc/ld.so.cache ("glibc-ld.so.cache1.1"
// format, with the glibc-hwcaps extension of glibc 2.33+) and reads the
// loader configuration (ConfDirs) and the ELF facts (ReadELF) glibc's
// ldconfig builds it from. The CDI generator uses it to find a driver
// root's libraries the way the dynamic loader would; nvinject-cdi-hook
// builds a container's cache with it, so no ldconfig runs; the simulated
// driver root writes one.
package ldcache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

const (
	magic      = "glibc-ld.so.cache1.1"
	headerSize = 48
	entrySize  = 24

	// extMagic starts the extension directory (glibc's
	// cache_extension_magic); tags 0 and 1 are the generator string and
	// the glibc-hwcaps subdirectory names.
	extMagic     = 0xeaa42174
	tagGenerator = 0
	tagHWCaps    = 1
	// hwcapExtension marks an entry of a glibc-hwcaps subdirectory; the
	// low 32 bits index the hwcaps section (DL_CACHE_HWCAP_EXTENSION).
	hwcapExtension = 1 << 62
)

// Flags of an entry: ELF libc6 plus the ABI of the library.
const (
	FlagELF      = 0x0001
	FlagELFLibc6 = 0x0003
	FlagX8664    = 0x0300
	FlagX32      = 0x0800
	FlagAArch64  = 0x0a00
	flagArchMask = 0x0f00
)

// Entry maps a library's soname to its path.
type Entry struct {
	Flags int32
	Name  string
	Path  string
	// HWCaps is the glibc-hwcaps subdirectory (such as x86-64-v3) the
	// library is in, "" for none.
	HWCaps string
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
	hwcaps := hwcapsNames(hdr)
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
		entry := Entry{Flags: int32(le.Uint32(e[0:4])), Name: key, Path: val}
		if hwcap := le.Uint64(e[16:24]); hwcap>>32&^0x3ff == hwcapExtension>>32 {
			if idx := uint32(hwcap); uint64(idx) < uint64(len(hwcaps)) {
				entry.HWCaps = hwcaps[idx]
			} else {
				return nil, fmt.Errorf("%w: entry %s names glibc-hwcaps subdirectory %d of %d", ErrFormat, key, idx, len(hwcaps))
			}
		}
		out = append(out, entry)
	}
	return out, nil
}

// hwcapsNames reads the glibc-hwcaps subdirectory names of the cache's
// extension directory, none when it has none or it is malformed (the
// loader then ignores it too).
func hwcapsNames(hdr []byte) []string {
	le := binary.LittleEndian
	off := uint64(le.Uint32(hdr[32:36]))
	if off == 0 || off%4 != 0 || off+8 > uint64(len(hdr)) || le.Uint32(hdr[off:]) != extMagic {
		return nil
	}
	count := uint64(le.Uint32(hdr[off+4:]))
	if off+8+count*16 > uint64(len(hdr)) {
		return nil
	}
	for i := range count {
		sec := hdr[off+8+i*16:]
		if le.Uint32(sec) != tagHWCaps {
			continue
		}
		start, size := uint64(le.Uint32(sec[8:])), uint64(le.Uint32(sec[12:]))
		if start%4 != 0 || size%4 != 0 || start+size > uint64(len(hdr)) {
			return nil
		}
		var names []string
		for j := start; j < start+size; j += 4 {
			name, err := cstring(hdr, le.Uint32(hdr[j:]))
			if err != nil {
				return nil
			}
			names = append(names, name)
		}
		return names
	}
	return nil
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

// Marshal writes entries, in their order, as a new-format ld.so.cache
// (the loader binary-searches it: see Sort). Entries with HWCaps get
// glibc's hwcaps extension.
func Marshal(entries []Entry) []byte { return MarshalGenerated(entries, "") }

// MarshalGenerated is Marshal recording generator as the program that
// wrote the cache (ldconfig -p prints it).
func MarshalGenerated(entries []Entry, generator string) []byte {
	le := binary.LittleEndian
	var strs bytes.Buffer
	strBase := uint32(headerSize + len(entries)*entrySize)
	offs := make([][2]uint32, len(entries))
	var hwcaps []string
	for _, e := range entries {
		if e.HWCaps != "" && !slices.Contains(hwcaps, e.HWCaps) {
			hwcaps = append(hwcaps, e.HWCaps)
		}
	}
	slices.Sort(hwcaps) // glibc sorts the section by strcmp
	hwcapOffs := make([]uint32, len(hwcaps))
	for i, h := range hwcaps {
		hwcapOffs[i] = strBase + uint32(strs.Len())
		strs.WriteString(h)
		strs.WriteByte(0)
	}
	for i, e := range entries {
		offs[i][0] = strBase + uint32(strs.Len())
		strs.WriteString(e.Name)
		strs.WriteByte(0)
		offs[i][1] = strBase + uint32(strs.Len())
		strs.WriteString(e.Path)
		strs.WriteByte(0)
	}
	out := make([]byte, headerSize+len(entries)*entrySize, int(strBase)+strs.Len()+64+4*len(hwcaps)+len(generator))
	copy(out, magic)
	le.PutUint32(out[20:24], uint32(len(entries)))
	le.PutUint32(out[24:28], uint32(strs.Len()))
	out[28] = 2 // little-endian, as glibc records it
	for i, e := range entries {
		p := out[headerSize+i*entrySize:]
		le.PutUint32(p[0:4], uint32(e.Flags))
		le.PutUint32(p[4:8], offs[i][0])
		le.PutUint32(p[8:12], offs[i][1])
		if e.HWCaps != "" {
			le.PutUint64(p[16:24], hwcapExtension|uint64(slices.Index(hwcaps, e.HWCaps)))
		}
	}
	out = append(out, strs.Bytes()...)
	if len(hwcaps) == 0 && generator == "" {
		return out
	}
	// The extension directory follows the strings, 4-byte aligned, then
	// the hwcaps section, then the generator string, as glibc lays it out.
	for len(out)%4 != 0 {
		out = append(out, 0)
	}
	le.PutUint32(out[32:36], uint32(len(out)))
	nsec := 0
	if generator != "" {
		nsec++
	}
	if len(hwcaps) > 0 {
		nsec++
	}
	dataOff := uint32(len(out) + 8 + 16*nsec)
	out = le.AppendUint32(out, extMagic)
	out = le.AppendUint32(out, uint32(nsec))
	if len(hwcaps) > 0 {
		out = append(le.AppendUint32(le.AppendUint32(out, tagHWCaps), 0), 0, 0, 0, 0, 0, 0, 0, 0)
		le.PutUint32(out[len(out)-8:], dataOff)
		le.PutUint32(out[len(out)-4:], uint32(4*len(hwcaps)))
	}
	if generator != "" {
		out = append(le.AppendUint32(le.AppendUint32(out, tagGenerator), 0), 0, 0, 0, 0, 0, 0, 0, 0)
		le.PutUint32(out[len(out)-8:], dataOff+uint32(4*len(hwcaps)))
		le.PutUint32(out[len(out)-4:], uint32(len(generator)))
	}
	for _, o := range hwcapOffs {
		out = le.AppendUint32(out, o)
	}
	return append(out, generator...)
}
