package ldcache

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
)

// Limits on the loader configuration ConfDirs reads: it comes from an image
// or a driver root, neither of which is trusted.
const (
	// MaxConfSize bounds one configuration file.
	MaxConfSize = 1 << 20
	// MaxConfFiles bounds the files read, includes counted.
	MaxConfFiles = 256
	// MaxConfDepth bounds include nesting (glibc's ldconfig has no bound
	// and recurses until it crashes on a loop).
	MaxConfDepth = 8
	// MaxConfDirs bounds the directories listed.
	MaxConfDirs = 4096
	// maxGlobEntries bounds the directory entries one include pattern
	// looks at.
	maxGlobEntries = 1 << 16
)

// ConfFile is the loader configuration ConfDirs starts from.
const ConfFile = "/etc/ld.so.conf"

// ErrConfLimit marks a loader configuration past one of the limits above.
var ErrConfLimit = errors.New("loader configuration too large")

// ConfDirs returns the library directories /etc/ld.so.conf of the root
// fsys lists, read the way glibc 2.36's ldconfig reads it: '#' starts a
// comment; "include PATTERN..." reads the files each glob pattern matches
// (sorted; a relative pattern is relative to the including file's
// directory; "*" does not match a leading '.'); a "hwcap" line is ignored;
// any other line is one directory, with a "=TYPE" suffix, trailing blanks
// and trailing slashes removed. Directories come back absolute and
// cleaned, in the order listed, without duplicates; a relative one is
// dropped (ldconfig would take it relative to its working directory).
// Nothing is executed or interpreted as an option: a line "-r /x" is a
// relative directory name and dropped. Files that cannot be opened are
// skipped, as ldconfig skips them; only the limits above give an error.
func ConfDirs(fsys fs.FS) ([]string, error) {
	p := confParser{fsys: fsys, seen: map[string]bool{}}
	if err := p.file(ConfFile, 0); err != nil {
		return nil, err
	}
	return p.dirs, nil
}

type confParser struct {
	fsys  fs.FS
	files int
	dirs  []string
	seen  map[string]bool
}

// fsPath turns the absolute path p into fsys's form ("etc/ld.so.conf").
func fsPath(p string) string {
	if p = strings.TrimPrefix(path.Clean("/"+p), "/"); p == "" {
		return "."
	}
	return p
}

func (p *confParser) file(name string, depth int) error {
	if depth > MaxConfDepth {
		return fmt.Errorf("%w: %s is included more than %d levels deep (an include loop?)", ErrConfLimit, name, MaxConfDepth)
	}
	if p.files++; p.files > MaxConfFiles {
		return fmt.Errorf("%w: more than %d files, at %s", ErrConfLimit, MaxConfFiles, name)
	}
	data, err := readConf(p.fsys, name)
	if errors.Is(err, ErrConfLimit) {
		return err
	}
	if err != nil {
		return nil
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		line, _, _ = strings.Cut(line, "\x00")
		line, _, _ = strings.Cut(line, "#")
		line = strings.TrimLeft(line, " \t\n\v\f\r")
		switch {
		case line == "":
		case strings.HasPrefix(line, "include") && len(line) > 7 && (line[7] == ' ' || line[7] == '\t'):
			for pat := range strings.FieldsFuncSeq(line[8:], func(r rune) bool { return r == ' ' || r == '\t' }) {
				if !path.IsAbs(pat) {
					pat = path.Join(path.Dir(name), pat)
				}
				matches, err := glob(p.fsys, path.Clean(pat))
				if err != nil {
					return fmt.Errorf("%s: include %s: %w", name, pat, err)
				}
				for _, m := range matches {
					if err := p.file(m, depth+1); err != nil {
						return err
					}
				}
			}
		case len(line) > 5 && strings.EqualFold(line[:5], "hwcap") && (line[5] == ' ' || line[5] == '\t'):
		default:
			if err := p.dir(line); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *confParser) dir(line string) error {
	d, _, _ := strings.Cut(line, "=")
	d = strings.TrimRight(d, " \t\n\v\f\r")
	d = strings.TrimRight(d, "/")
	if !path.IsAbs(d) {
		return nil
	}
	d = path.Clean(d)
	if p.seen[d] {
		return nil
	}
	if len(p.dirs) == MaxConfDirs {
		return fmt.Errorf("%w: more than %d library directories", ErrConfLimit, MaxConfDirs)
	}
	p.seen[d] = true
	p.dirs = append(p.dirs, d)
	return nil
}

// readConf reads the configuration file name, at most MaxConfSize bytes.
func readConf(fsys fs.FS, name string) ([]byte, error) {
	f, err := fsys.Open(fsPath(name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxConfSize {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrConfLimit, name, MaxConfSize)
	}
	return data, nil
}

// glob returns the absolute paths matching the cleaned absolute pattern,
// sorted as glibc's glob sorts them; a bad pattern matches nothing.
func glob(fsys fs.FS, pattern string) ([]string, error) {
	cands := []string{"/"}
	for elem := range strings.SplitSeq(strings.TrimPrefix(pattern, "/"), "/") {
		if elem == "" {
			continue
		}
		if !strings.ContainsAny(elem, `*?[\`) {
			for i, c := range cands {
				cands[i] = path.Join(c, elem)
			}
			continue
		}
		pat := bangToCaret(elem)
		if _, err := path.Match(pat, ""); err != nil {
			return nil, nil
		}
		var next []string
		for _, c := range cands {
			names, err := readDirNames(fsys, c)
			if err != nil {
				return nil, err
			}
			for _, name := range names {
				if strings.HasPrefix(name, ".") && !strings.HasPrefix(elem, ".") {
					continue
				}
				if ok, _ := path.Match(pat, name); ok {
					next = append(next, path.Join(c, name))
				}
			}
		}
		if cands = next; len(cands) == 0 {
			return nil, nil
		}
		if len(cands) > MaxConfFiles {
			return nil, fmt.Errorf("%w: %s matches more than %d paths", ErrConfLimit, pattern, MaxConfFiles)
		}
	}
	slices.Sort(cands)
	return cands, nil
}

// bangToCaret rewrites glob's "[!...]" negation as path.Match's "[^...]".
func bangToCaret(elem string) string {
	var b strings.Builder
	inClass := false
	for i := 0; i < len(elem); i++ {
		c := elem[i]
		switch {
		case c == '\\' && i+1 < len(elem):
			b.WriteByte(c)
			i++
			c = elem[i]
		case c == '[' && !inClass:
			inClass = true
			b.WriteByte(c)
			if i+1 < len(elem) && elem[i+1] == '!' {
				b.WriteByte('^')
				i++
			}
			continue
		case c == ']' && inClass:
			inClass = false
		}
		b.WriteByte(c)
	}
	return b.String()
}

// readDirNames lists the names in the directory dir, nothing when it
// cannot be read, an error past maxGlobEntries names.
func readDirNames(fsys fs.FS, dir string) ([]string, error) {
	f, err := fsys.Open(fsPath(dir))
	if err != nil {
		return nil, nil
	}
	defer f.Close()
	rd, ok := f.(fs.ReadDirFile)
	if !ok {
		return nil, nil
	}
	var names []string
	for {
		ents, err := rd.ReadDir(1024)
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if len(names) > maxGlobEntries {
			return nil, fmt.Errorf("%w: %s has more than %d entries", ErrConfLimit, dir, maxGlobEntries)
		}
		if err != nil || len(ents) == 0 {
			return names, nil
		}
	}
}
