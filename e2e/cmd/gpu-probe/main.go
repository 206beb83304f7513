// Command gpu-probe checks, from inside a container (or a chroot), that NVIDIA's driver
// libraries can be loaded the way CUDA programs load them: it dlopens libcuda.so.1,
// libcuda.so, libnvidia-ml.so.1, libnvidia-ptxjitcompiler.so.1 and libnvidia-nvvm.so.4
// through the dynamic loader (ld.so.cache, LD_LIBRARY_PATH), then calls
// cuDriverGetVersion, cuInit(0) and nvmlInit_v2 and prints one line per item, or one
// JSON object with --json.
//
// Exit status: 0 when every library loaded, whatever cuInit and nvmlInit return (with
// the real driver user space and no kernel module they return 100 CUDA_ERROR_NO_DEVICE
// and 9 Driver Not Loaded); 1 when a library failed to load, naming it and dlerror().
//
// It needs glibc (dlopen of glibc-linked libraries), so it is built with cgo and runs on
// a glibc base such as e2e/harness/bookworm's.
package main

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>

// dlopen and dlerror on the same thread (dlerror's state is per thread).
static void *probe_open(const char *name, char **err) {
	void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		*err = dlerror();
	}
	return h;
}

// The loaded object's path as the loader found it (link_map l_name).
static const char *probe_path(void *h) {
	struct link_map *lm = NULL;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || lm == NULL) {
		return NULL;
	}
	return lm->l_name;
}

static void *probe_sym(void *h, const char *name) { return dlsym(h, name); }

typedef int (*fn_intp)(int *);
typedef int (*fn_uint)(unsigned int);
typedef int (*fn_void)(void);
typedef int (*fn_errname)(int, const char **);
typedef const char *(*fn_errstr)(int);

static int call_intp(void *f, int *out) { return ((fn_intp)f)(out); }
static int call_uint(void *f, unsigned int v) { return ((fn_uint)f)(v); }
static int call_void(void *f) { return ((fn_void)f)(); }
static int call_errname(void *f, int code, const char **out) { return ((fn_errname)f)(code, out); }
static const char *call_errstr(void *f, int code) { return ((fn_errstr)f)(code); }
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/nvinject/nvinject/shared/cli"
)

// Libraries are what a CUDA program and NVML users load, in that order: the driver API
// (soname and the unversioned name Triton links with -lcuda), NVML, the PTX JIT and NVVM
// libcuda loads for JIT compilation.
var Libraries = []string{
	"libcuda.so.1",
	"libcuda.so",
	"libnvidia-ml.so.1",
	"libnvidia-ptxjitcompiler.so.1",
	"libnvidia-nvvm.so.4",
}

// Library is one dlopen result.
type Library struct {
	Name     string `json:"name"`
	OK       bool   `json:"ok"`
	Path     string `json:"path,omitempty"`     // as the loader found it (link_map l_name)
	RealPath string `json:"realpath,omitempty"` // with symlinks resolved
	Error    string `json:"error,omitempty"`    // dlerror()
}

// Call is one driver call's result.
type Call struct {
	Call    string `json:"call"`
	Code    int    `json:"code"`
	Name    string `json:"name,omitempty"`    // CUresult name or NVML error string
	Value   *int   `json:"value,omitempty"`   // cuDriverGetVersion's version
	Skipped string `json:"skipped,omitempty"` // why the call was not made
}

// Report is the whole probe.
type Report struct {
	Libraries []Library `json:"libraries"`
	Calls     []Call    `json:"calls"`
	AllLoaded bool      `json:"all_loaded"`
}

func main() {
	c := cli.New("gpu-probe", "[--json]", cli.WithAbout(fmt.Sprintf("dlopens %s, calls cuDriverGetVersion, cuInit(0) and nvmlInit_v2.\n"+
		"Exit 0 when every library loaded, 1 when one did not.", strings.Join(Libraries, ", "))))
	asJSON := c.Flags().Bool("json", false, "print one JSON object instead of one line per item")
	if err := c.Parse(os.Args[1:], nil); err != nil {
		os.Exit(cli.Code("gpu-probe", err, os.Stderr))
	}
	r := probe()
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	} else {
		fmt.Print(r.Text())
	}
	if !r.AllLoaded {
		os.Exit(1)
	}
}

func probe() Report {
	r := Report{AllLoaded: true}
	handles := map[string]unsafe.Pointer{}
	for _, name := range Libraries {
		lib, h := open(name)
		r.Libraries = append(r.Libraries, lib)
		if h == nil {
			r.AllLoaded = false
			continue
		}
		handles[name] = h
	}
	cuda := handles["libcuda.so.1"]
	nvml := handles["libnvidia-ml.so.1"]
	r.Calls = append(r.Calls, cuDriverGetVersion(cuda), cuInit(cuda), nvmlInit(nvml))
	return r
}

func open(name string) (Library, unsafe.Pointer) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var cerr *C.char
	h := C.probe_open(cname, &cerr)
	if h == nil {
		msg := "unknown error"
		if cerr != nil {
			msg = C.GoString(cerr)
		}
		return Library{Name: name, Error: msg}, nil
	}
	lib := Library{Name: name, OK: true}
	if p := C.probe_path(h); p != nil {
		lib.Path = C.GoString(p)
		lib.RealPath = lib.Path
		if real, err := filepath.EvalSymlinks(lib.Path); err == nil {
			lib.RealPath = real
		}
	}
	return lib, h
}

func sym(h unsafe.Pointer, name string) unsafe.Pointer {
	if h == nil {
		return nil
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.probe_sym(h, cname)
}

// cuNames are the CUresult values a driver without its kernel module (or a GPU) gives,
// for when cuGetErrorName is unavailable.
var cuNames = map[int]string{
	0:   "CUDA_SUCCESS",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	35:  "CUDA_ERROR_INSUFFICIENT_DRIVER",
	100: "CUDA_ERROR_NO_DEVICE",
	304: "CUDA_ERROR_OPERATING_SYSTEM",
	999: "CUDA_ERROR_UNKNOWN",
}

func cuName(cuda unsafe.Pointer, code int) string {
	if f := sym(cuda, "cuGetErrorName"); f != nil {
		var s *C.char
		if C.call_errname(f, C.int(code), &s) == 0 && s != nil {
			return C.GoString(s)
		}
	}
	if n, ok := cuNames[code]; ok {
		return n
	}
	return "unknown CUresult"
}

func cuDriverGetVersion(cuda unsafe.Pointer) Call {
	c := Call{Call: "cuDriverGetVersion"}
	f := sym(cuda, "cuDriverGetVersion")
	if f == nil {
		c.Skipped = skipReason(cuda, "libcuda.so.1", "cuDriverGetVersion")
		return c
	}
	var v C.int
	c.Code = int(C.call_intp(f, &v))
	c.Name = cuName(cuda, c.Code)
	if c.Code == 0 {
		n := int(v)
		c.Value = &n
	}
	return c
}

func cuInit(cuda unsafe.Pointer) Call {
	c := Call{Call: "cuInit(0)"}
	f := sym(cuda, "cuInit")
	if f == nil {
		c.Skipped = skipReason(cuda, "libcuda.so.1", "cuInit")
		return c
	}
	c.Code = int(C.call_uint(f, 0))
	c.Name = cuName(cuda, c.Code)
	return c
}

func nvmlInit(nvml unsafe.Pointer) Call {
	c := Call{Call: "nvmlInit"}
	f := sym(nvml, "nvmlInit_v2")
	if f == nil {
		c.Skipped = skipReason(nvml, "libnvidia-ml.so.1", "nvmlInit_v2")
		return c
	}
	c.Code = int(C.call_void(f))
	if es := sym(nvml, "nvmlErrorString"); es != nil {
		if s := C.call_errstr(es, C.int(c.Code)); s != nil {
			c.Name = C.GoString(s)
		}
	}
	if c.Code == 0 {
		if shutdown := sym(nvml, "nvmlShutdown"); shutdown != nil {
			C.call_void(shutdown)
		}
	}
	return c
}

func skipReason(h unsafe.Pointer, lib, fn string) string {
	if h == nil {
		return lib + " not loaded"
	}
	return lib + " has no " + fn
}

// Text renders the report one line per item, then a summary line.
func (r Report) Text() string {
	var b strings.Builder
	var failed []string
	for _, l := range r.Libraries {
		if l.OK {
			fmt.Fprintf(&b, "dlopen %s: ok (%s)\n", l.Name, l.RealPath)
			continue
		}
		failed = append(failed, l.Name)
		fmt.Fprintf(&b, "dlopen %s: FAILED: %s\n", l.Name, l.Error)
	}
	for _, c := range r.Calls {
		switch {
		case c.Skipped != "":
			fmt.Fprintf(&b, "%s: skipped (%s)\n", c.Call, c.Skipped)
		case c.Value != nil:
			fmt.Fprintf(&b, "%s = %d %s, version %d\n", c.Call, c.Code, c.Name, *c.Value)
		default:
			fmt.Fprintf(&b, "%s = %d %s\n", c.Call, c.Code, c.Name)
		}
	}
	if len(failed) == 0 {
		fmt.Fprintf(&b, "all %d libraries loaded\n", len(r.Libraries))
	} else {
		fmt.Fprintf(&b, "%d of %d libraries failed to load: %s\n", len(failed), len(r.Libraries), strings.Join(failed, ", "))
	}
	return b.String()
}
