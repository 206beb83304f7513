// Package ldcachetest writes small ELF shared objects for tests: enough
// for glibc's ldconfig and ldcache.ReadELF to index them (a PT_LOAD, a
// PT_DYNAMIC with DT_STRTAB, DT_SONAME and DT_NEEDED), not enough to load.
package ldcachetest

import (
	"debug/elf"
	"encoding/binary"
)

// DSO describes a shared object.
type DSO struct {
	SOName  string // "" for none
	Needed  []string
	Machine elf.Machine // EM_X86_64 when zero
	Class   elf.Class   // ELFCLASS64 when zero
}

// Bytes is the object's ELF file.
func (d DSO) Bytes() []byte {
	if d.Machine == 0 {
		d.Machine = elf.EM_X86_64
	}
	if d.Class == 0 {
		d.Class = elf.ELFCLASS64
	}
	le := binary.LittleEndian
	is64 := d.Class == elf.ELFCLASS64
	ehsize, phentsize, word := 52, 32, 4
	if is64 {
		ehsize, phentsize, word = 64, 56, 8
	}
	strtab := []byte{0}
	str := func(s string) uint64 {
		off := uint64(len(strtab))
		strtab = append(append(strtab, s...), 0)
		return off
	}
	var dyn [][2]uint64
	for _, n := range d.Needed {
		dyn = append(dyn, [2]uint64{uint64(elf.DT_NEEDED), str(n)})
	}
	if d.SOName != "" {
		dyn = append(dyn, [2]uint64{uint64(elf.DT_SONAME), str(d.SOName)})
	}
	phoff := ehsize
	dynoff := phoff + 2*phentsize
	strOff := dynoff + (len(dyn)+3)*2*word
	dyn = append(dyn, [2]uint64{uint64(elf.DT_STRTAB), uint64(strOff)}, [2]uint64{uint64(elf.DT_STRSZ), uint64(len(strtab))}, [2]uint64{uint64(elf.DT_NULL), 0})
	total := strOff + len(strtab)

	out := make([]byte, strOff, total)
	copy(out, elf.ELFMAG)
	out[elf.EI_CLASS], out[elf.EI_DATA], out[elf.EI_VERSION] = byte(d.Class), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	le.PutUint16(out[16:], uint16(elf.ET_DYN))
	le.PutUint16(out[18:], uint16(d.Machine))
	le.PutUint32(out[20:], uint32(elf.EV_CURRENT))
	phdr := func(i int, typ elf.ProgType, off, size uint64) {
		p := out[phoff+i*phentsize:]
		le.PutUint32(p, uint32(typ))
		if is64 {
			le.PutUint32(p[4:], uint32(elf.PF_R))
			le.PutUint64(p[8:], off)
			le.PutUint64(p[16:], off)
			le.PutUint64(p[24:], off)
			le.PutUint64(p[32:], size)
			le.PutUint64(p[40:], size)
			le.PutUint64(p[48:], 8)
		} else {
			le.PutUint32(p[4:], uint32(off))
			le.PutUint32(p[8:], uint32(off))
			le.PutUint32(p[12:], uint32(off))
			le.PutUint32(p[16:], uint32(size))
			le.PutUint32(p[20:], uint32(size))
			le.PutUint32(p[24:], uint32(elf.PF_R))
			le.PutUint32(p[28:], 4)
		}
	}
	phdr(0, elf.PT_LOAD, 0, uint64(total))
	phdr(1, elf.PT_DYNAMIC, uint64(dynoff), uint64(len(dyn)*2*word))
	if is64 {
		le.PutUint64(out[32:], uint64(phoff))
		le.PutUint16(out[52:], uint16(ehsize))
		le.PutUint16(out[54:], uint16(phentsize))
		le.PutUint16(out[56:], 2)
	} else {
		le.PutUint32(out[28:], uint32(phoff))
		le.PutUint16(out[40:], uint16(ehsize))
		le.PutUint16(out[42:], uint16(phentsize))
		le.PutUint16(out[44:], 2)
	}
	for i, e := range dyn {
		p := out[dynoff+i*2*word:]
		if is64 {
			le.PutUint64(p, e[0])
			le.PutUint64(p[8:], e[1])
		} else {
			le.PutUint32(p, uint32(e[0]))
			le.PutUint32(p[4:], uint32(e[1]))
		}
	}
	return append(out, strtab...)
}
