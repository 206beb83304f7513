package ldcache

import (
	"bytes"
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/nvinject/nvinject/cdi/ldcache/ldcachetest"
)

func TestReadELF(t *testing.T) {
	for _, tc := range []struct {
		name string
		dso  ldcachetest.DSO
		want ELFInfo
	}{
		{"x86-64", ldcachetest.DSO{SOName: "libcuda.so.1"}, ELFInfo{"libcuda.so.1", FlagX8664 | FlagELFLibc6}},
		{"no soname", ldcachetest.DSO{}, ELFInfo{"", FlagX8664 | FlagELFLibc6}},
		{"aarch64", ldcachetest.DSO{SOName: "libcuda.so.1", Machine: elf.EM_AARCH64}, ELFInfo{"libcuda.so.1", FlagAArch64 | FlagELFLibc6}},
		{"x32", ldcachetest.DSO{SOName: "libx.so.1", Class: elf.ELFCLASS32}, ELFInfo{"libx.so.1", FlagX32 | FlagELFLibc6}},
		{"i386 needing libc", ldcachetest.DSO{SOName: "libx.so.1", Machine: elf.EM_386, Class: elf.ELFCLASS32, Needed: []string{"libdl.so.2", "libc.so.6"}}, ELFInfo{"libx.so.1", FlagELFLibc6}},
		{"i386 without libc", ldcachetest.DSO{SOName: "libx.so.1", Machine: elf.EM_386, Class: elf.ELFCLASS32}, ELFInfo{"libx.so.1", FlagELF}},
	} {
		data := tc.dso.Bytes()
		got, err := ReadELF(bytes.NewReader(data), int64(len(data)))
		if err != nil || got != tc.want {
			t.Errorf("%s: ReadELF = %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
	good := ldcachetest.DSO{SOName: "libx.so.1"}.Bytes()
	for name, data := range map[string][]byte{
		"empty":     nil,
		"not ELF":   []byte("#!/bin/sh\n"),
		"truncated": good[:60],
		"riscv":     ldcachetest.DSO{SOName: "libx.so.1", Machine: elf.EM_RISCV}.Bytes(),
		"executable": func() []byte {
			b := bytes.Clone(good)
			b[16] = byte(elf.ET_EXEC)
			return b
		}(),
		"soname outside the file": func() []byte {
			b := bytes.Clone(good)
			// The first dynamic entry is DT_SONAME; its value follows its tag.
			copy(b[64+2*56+8:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
			return b
		}(),
		"program headers past the end": func() []byte {
			b := bytes.Clone(good)
			b[56] = 0xff
			return b
		}(),
	} {
		if info, err := ReadELF(bytes.NewReader(data), int64(len(data))); !errors.Is(err, ErrNotLibrary) {
			t.Errorf("%s: ReadELF = %+v, %v; want ErrNotLibrary", name, info, err)
		}
	}
}

// Real libraries of this host: ReadELF agrees with debug/elf's reading of
// DT_SONAME through the section headers.
func TestReadELFHostLibraries(t *testing.T) {
	libs, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/lib*.so.*")
	if len(libs) == 0 {
		t.Skip("no host libraries in /usr/lib/x86_64-linux-gnu")
	}
	checked := 0
	for _, l := range libs {
		f, err := os.Open(l)
		if err != nil {
			continue
		}
		st, _ := f.Stat()
		ef, err := elf.NewFile(f)
		if err != nil || ef.Type != elf.ET_DYN {
			f.Close()
			continue
		}
		want, _ := ef.DynString(elf.DT_SONAME)
		got, err := ReadELF(f, st.Size())
		f.Close()
		if err != nil || (len(want) > 0 && got.SOName != want[0]) || got.Flags != FlagX8664|FlagELFLibc6 {
			t.Errorf("%s: ReadELF = %+v, %v; debug/elf reads DT_SONAME %q", l, got, err, want)
		}
		if checked++; checked == 200 {
			break
		}
	}
	if checked == 0 {
		t.Skip("no readable host libraries")
	}
}

// A library in an image is hostile input: whatever its bytes, ReadELF
// returns or fails with ErrNotLibrary, without panicking.
func FuzzReadELF(f *testing.F) {
	f.Add(ldcachetest.DSO{SOName: "libcuda.so.1", Needed: []string{"libc.so.6"}}.Bytes())
	f.Add(ldcachetest.DSO{SOName: "libx.so.1", Machine: elf.EM_386, Class: elf.ELFCLASS32}.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		info, err := ReadELF(bytes.NewReader(data), int64(len(data)))
		if err != nil && !errors.Is(err, ErrNotLibrary) {
			t.Fatalf("ReadELF: %v", err)
		}
		if len(info.SOName) > maxSONameSz {
			t.Fatalf("soname of %d bytes", len(info.SOName))
		}
	})
}
