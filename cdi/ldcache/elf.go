package ldcache

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ELFInfo is what ldconfig records of a shared object.
type ELFInfo struct {
	// SOName is DT_SONAME, "" when the object has none (ldconfig then
	// indexes it by its file name).
	SOName string
	// Flags is the cache entry's flags: the ABI and libc6 bits.
	Flags int32
}

// Limits on what ReadELF reads of a file it must not trust.
const (
	maxPhnum    = 1 << 12
	maxDynamic  = 1 << 20
	maxSONameSz = 4096
)

// ErrNotLibrary marks a file ldconfig would not index: not a little-endian
// ELF shared object of a known machine with a dynamic segment.
var ErrNotLibrary = errors.New("not a shared library ldconfig indexes")

// ReadELF reads the soname and flags of the shared object r (size bytes)
// the way glibc 2.36's ldconfig does (elf/readelflib.c and its x86 and
// aarch64 variants): program headers, PT_DYNAMIC, DT_STRTAB mapped to a
// file offset through the PT_LOAD segment holding it, DT_SONAME. Every
// read is bounded and checked against size; nothing is mapped or
// executed.
func ReadELF(r io.ReaderAt, size int64) (ELFInfo, error) {
	var ident [elf.EI_NIDENT]byte
	if _, err := r.ReadAt(ident[:], 0); err != nil {
		return ELFInfo{}, fmt.Errorf("%w: %v", ErrNotLibrary, err)
	}
	if string(ident[:4]) != elf.ELFMAG || elf.Data(ident[elf.EI_DATA]) != elf.ELFDATA2LSB {
		return ELFInfo{}, fmt.Errorf("%w: not a little-endian ELF file", ErrNotLibrary)
	}
	class := elf.Class(ident[elf.EI_CLASS])
	var h struct {
		typ, machine        uint16
		phoff               uint64
		phentsize, phnum    uint16
		wantPhentsize, word int
	}
	le := binary.LittleEndian
	switch class {
	case elf.ELFCLASS64:
		var b [64]byte
		if _, err := r.ReadAt(b[:], 0); err != nil {
			return ELFInfo{}, fmt.Errorf("%w: truncated header", ErrNotLibrary)
		}
		h.typ, h.machine, h.phoff = le.Uint16(b[16:]), le.Uint16(b[18:]), le.Uint64(b[32:])
		h.phentsize, h.phnum, h.wantPhentsize, h.word = le.Uint16(b[54:]), le.Uint16(b[56:]), 56, 8
	case elf.ELFCLASS32:
		var b [52]byte
		if _, err := r.ReadAt(b[:], 0); err != nil {
			return ELFInfo{}, fmt.Errorf("%w: truncated header", ErrNotLibrary)
		}
		h.typ, h.machine, h.phoff = le.Uint16(b[16:]), le.Uint16(b[18:]), uint64(le.Uint32(b[28:]))
		h.phentsize, h.phnum, h.wantPhentsize, h.word = le.Uint16(b[42:]), le.Uint16(b[44:]), 32, 4
	default:
		return ELFInfo{}, fmt.Errorf("%w: unknown ELF class %d", ErrNotLibrary, class)
	}
	if elf.Type(h.typ) != elf.ET_DYN {
		return ELFInfo{}, fmt.Errorf("%w: ELF type %v", ErrNotLibrary, elf.Type(h.typ))
	}
	var arch int32
	switch m := elf.Machine(h.machine); {
	case m == elf.EM_X86_64 && class == elf.ELFCLASS64:
		arch = FlagX8664 | FlagELFLibc6
	case m == elf.EM_X86_64:
		arch = FlagX32 | FlagELFLibc6
	case m == elf.EM_AARCH64 && class == elf.ELFCLASS64:
		arch = FlagAArch64 | FlagELFLibc6
	case m == elf.EM_386 && class == elf.ELFCLASS32:
	default:
		return ELFInfo{}, fmt.Errorf("%w: machine %v, class %v", ErrNotLibrary, m, class)
	}
	if int(h.phentsize) != h.wantPhentsize || h.phnum > maxPhnum || h.phoff > uint64(size) || uint64(h.phnum)*uint64(h.phentsize) > uint64(size)-h.phoff {
		return ELFInfo{}, fmt.Errorf("%w: bad program headers", ErrNotLibrary)
	}
	ph := make([]byte, int(h.phnum)*int(h.phentsize))
	if _, err := r.ReadAt(ph, int64(h.phoff)); err != nil {
		return ELFInfo{}, fmt.Errorf("%w: program headers: %v", ErrNotLibrary, err)
	}
	type seg struct{ typ, off, vaddr, filesz uint64 }
	segs := make([]seg, h.phnum)
	for i := range segs {
		p := ph[i*int(h.phentsize):]
		if class == elf.ELFCLASS64 {
			segs[i] = seg{uint64(le.Uint32(p)), le.Uint64(p[8:]), le.Uint64(p[16:]), le.Uint64(p[32:])}
		} else {
			segs[i] = seg{uint64(le.Uint32(p)), uint64(le.Uint32(p[4:])), uint64(le.Uint32(p[8:])), uint64(le.Uint32(p[16:]))}
		}
	}
	flag := int32(FlagELF)
	var dyn *seg
	for i, s := range segs {
		switch elf.ProgType(s.typ) {
		case elf.PT_DYNAMIC:
			if dyn == nil {
				dyn = &segs[i]
			}
		case elf.PT_INTERP:
			if interp, err := cstringAt(r, size, s.off); err == nil && knownInterpreters[interp] {
				flag = FlagELFLibc6
			}
		}
	}
	if dyn == nil || dyn.filesz == 0 {
		return ELFInfo{}, fmt.Errorf("%w: no dynamic segment", ErrNotLibrary)
	}
	n := min(dyn.filesz, maxDynamic, uint64(size)-min(dyn.off, uint64(size)))
	dynData := make([]byte, n)
	if _, err := r.ReadAt(dynData, int64(min(dyn.off, uint64(size)))); err != nil && !errors.Is(err, io.EOF) {
		return ELFInfo{}, fmt.Errorf("%w: dynamic segment: %v", ErrNotLibrary, err)
	}
	type tagVal struct{ tag, val uint64 }
	var dyns []tagVal
	for off := 0; off+2*h.word <= len(dynData); off += 2 * h.word {
		var t tagVal
		if h.word == 8 {
			t = tagVal{le.Uint64(dynData[off:]), le.Uint64(dynData[off+8:])}
		} else {
			t = tagVal{uint64(le.Uint32(dynData[off:])), uint64(le.Uint32(dynData[off+4:]))}
		}
		if elf.DynTag(t.tag) == elf.DT_NULL {
			break
		}
		dyns = append(dyns, t)
	}
	strtab, found := uint64(0), false
	for _, d := range dyns {
		if elf.DynTag(d.tag) != elf.DT_STRTAB {
			continue
		}
		loadoff := uint64(0)
		for _, s := range segs {
			if elf.ProgType(s.typ) == elf.PT_LOAD && d.val >= s.vaddr && d.val-s.vaddr < s.filesz {
				loadoff = s.vaddr - s.off
				break
			}
		}
		strtab, found = d.val-loadoff, true
		break
	}
	if !found || strtab > uint64(size) {
		return ELFInfo{}, fmt.Errorf("%w: no dynamic string table", ErrNotLibrary)
	}
	var info ELFInfo
	for _, d := range dyns {
		switch elf.DynTag(d.tag) {
		case elf.DT_NEEDED, elf.DT_SONAME:
			if d.val >= uint64(size) {
				return ELFInfo{}, fmt.Errorf("%w: %v string outside the file", ErrNotLibrary, elf.DynTag(d.tag))
			}
			name, err := cstringAt(r, size, strtab+d.val)
			if err != nil {
				return ELFInfo{}, fmt.Errorf("%w: %v: %v", ErrNotLibrary, elf.DynTag(d.tag), err)
			}
			if elf.DynTag(d.tag) == elf.DT_SONAME {
				info.SOName = name
			} else if flag == FlagELF && knownLibs[name] {
				flag = FlagELFLibc6
			}
		}
	}
	info.Flags = flag
	if arch != 0 {
		info.Flags = arch
	}
	return info, nil
}

// What makes ldconfig call an i386 object libc6 (sysdeps' readlib.c).
var (
	knownInterpreters = map[string]bool{"/lib/ld-linux.so.2": true, "/libx32/ld-linux-x32.so.2": true, "/lib64/ld-linux-x86-64.so.2": true}
	knownLibs         = map[string]bool{"libc.so.6": true, "libm.so.6": true}
)

// cstringAt reads the NUL-terminated string at off, at most maxSONameSz
// bytes, inside size.
func cstringAt(r io.ReaderAt, size int64, off uint64) (string, error) {
	if off >= uint64(size) {
		return "", fmt.Errorf("string at %d is outside the %d-byte file", off, size)
	}
	buf := make([]byte, min(maxSONameSz, uint64(size)-off))
	n, err := r.ReadAt(buf, int64(off))
	if n == 0 && err != nil {
		return "", err
	}
	end := bytes.IndexByte(buf[:n], 0)
	if end < 0 {
		return "", fmt.Errorf("string at %d is not terminated within %d bytes", off, maxSONameSz)
	}
	return string(buf[:end]), nil
}
