/*
 * cuda-check: checked CUDA work through the driver API alone, for the GPU check
 * (e2e/gpu/check.sh step 6). It dlopens libcuda.so.1 (no CUDA toolkit, no link-time
 * dependency on the driver), JIT-compiles a SAXPY kernel from the PTX below, runs it once
 * over N floats and compares every element with the host's result, then times LAUNCHES
 * launches with CUDA events and prints the memory bandwidth they reached.
 *
 * Output: one "key: value" line per fact. Exit status: 0 when the work was exact, 1 on a
 * wrong result or a CUDA error, 2 when libcuda.so.1 cannot be loaded, 3 when cuInit fails
 * (100 CUDA_ERROR_NO_DEVICE with the driver's user space and no kernel module).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;
typedef unsigned long long CUdeviceptr;

#define N (64u << 20) /* 64 Mi floats: 256 MiB an array */
#define LAUNCHES 50
#define BLOCK 256

static const char ptx[] =
	".version 7.0\n"
	".target sm_50\n"
	".address_size 64\n"
	".visible .entry saxpy(.param .u64 px, .param .u64 py, .param .f32 pa, .param .u32 pn)\n"
	"{\n"
	"	.reg .pred p;\n"
	"	.reg .b32 r<6>;\n"
	"	.reg .f32 f<4>;\n"
	"	.reg .b64 rd<8>;\n"
	"	ld.param.u64 rd1, [px];\n"
	"	ld.param.u64 rd2, [py];\n"
	"	ld.param.f32 f1, [pa];\n"
	"	ld.param.u32 r1, [pn];\n"
	"	mov.u32 r2, %ctaid.x;\n"
	"	mov.u32 r3, %ntid.x;\n"
	"	mov.u32 r4, %tid.x;\n"
	"	mad.lo.s32 r5, r2, r3, r4;\n"
	"	setp.ge.u32 p, r5, r1;\n"
	"	@p bra DONE;\n"
	"	cvta.to.global.u64 rd3, rd1;\n"
	"	cvta.to.global.u64 rd4, rd2;\n"
	"	mul.wide.u32 rd5, r5, 4;\n"
	"	add.s64 rd6, rd3, rd5;\n"
	"	add.s64 rd7, rd4, rd5;\n"
	"	ld.global.f32 f2, [rd6];\n"
	"	ld.global.f32 f3, [rd7];\n"
	"	fma.rn.f32 f3, f1, f2, f3;\n"
	"	st.global.f32 [rd7], f3;\n"
	"DONE:\n"
	"	ret;\n"
	"}\n";

static void *lib;

static void *sym(const char *name) {
	void *f = dlsym(lib, name);
	if (f == NULL) {
		printf("error: libcuda.so.1 has no %s\n", name);
		exit(1);
	}
	return f;
}

static CUresult (*cuGetErrorName)(CUresult, const char **);

static void check(CUresult r, const char *call) {
	if (r == 0) {
		return;
	}
	const char *name = "?";
	cuGetErrorName(r, &name);
	printf("error: %s = %d %s\n", call, r, name);
	exit(1);
}

int main(void) {
	lib = dlopen("libcuda.so.1", RTLD_NOW);
	if (lib == NULL) {
		printf("error: dlopen libcuda.so.1: %s\n", dlerror());
		return 2;
	}
	cuGetErrorName = sym("cuGetErrorName");
	CUresult (*cuInit)(unsigned) = sym("cuInit");
	CUresult r = cuInit(0);
	if (r != 0) {
		const char *name = "?";
		cuGetErrorName(r, &name);
		printf("cuInit: %d %s\n", r, name);
		return 3;
	}
	CUresult (*cuDeviceGetCount)(int *) = sym("cuDeviceGetCount");
	CUresult (*cuDeviceGet)(CUdevice *, int) = sym("cuDeviceGet");
	CUresult (*cuDeviceGetName)(char *, int, CUdevice) = sym("cuDeviceGetName");
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) = sym("cuDevicePrimaryCtxRetain");
	CUresult (*cuCtxSetCurrent)(CUcontext) = sym("cuCtxSetCurrent");
	CUresult (*cuModuleLoadData)(CUmodule *, const void *) = sym("cuModuleLoadData");
	CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) = sym("cuModuleGetFunction");
	CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
	CUresult (*cuMemFree)(CUdeviceptr) = sym("cuMemFree_v2");
	CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t) = sym("cuMemcpyHtoD_v2");
	CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) = sym("cuMemcpyDtoH_v2");
	CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **) = sym("cuLaunchKernel");
	CUresult (*cuCtxSynchronize)(void) = sym("cuCtxSynchronize");
	CUresult (*cuEventCreate)(CUevent *, unsigned) = sym("cuEventCreate");
	CUresult (*cuEventRecord)(CUevent, CUstream) = sym("cuEventRecord");
	CUresult (*cuEventSynchronize)(CUevent) = sym("cuEventSynchronize");
	CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent) = sym("cuEventElapsedTime");

	int count = 0;
	check(cuDeviceGetCount(&count), "cuDeviceGetCount");
	CUdevice dev;
	check(cuDeviceGet(&dev, 0), "cuDeviceGet");
	char name[256] = "";
	check(cuDeviceGetName(name, sizeof name, dev), "cuDeviceGetName");
	printf("devices: %d\ndevice 0: %s\n", count, name);
	CUcontext ctx;
	check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
	check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
	CUmodule mod;
	check(cuModuleLoadData(&mod, ptx), "cuModuleLoadData (PTX JIT)");
	CUfunction fn;
	check(cuModuleGetFunction(&fn, mod, "saxpy"), "cuModuleGetFunction");

	size_t bytes = (size_t)N * sizeof(float);
	float *x = malloc(bytes), *y = malloc(bytes), *out = malloc(bytes);
	if (x == NULL || y == NULL || out == NULL) {
		printf("error: cannot allocate %zu bytes of host memory\n", 3 * bytes);
		return 1;
	}
	for (uint32_t i = 0; i < N; i++) {
		/* Small integers and halves: every a*x+y below is exact in float. */
		x[i] = (float)(i % 1024) * 0.5f;
		y[i] = (float)(i % 777);
	}
	CUdeviceptr dx, dy;
	check(cuMemAlloc(&dx, bytes), "cuMemAlloc");
	check(cuMemAlloc(&dy, bytes), "cuMemAlloc");
	check(cuMemcpyHtoD(dx, x, bytes), "cuMemcpyHtoD");
	check(cuMemcpyHtoD(dy, y, bytes), "cuMemcpyHtoD");
	float a = 3.0f;
	unsigned n = N;
	void *args[] = {&dx, &dy, &a, &n};
	unsigned grid = (N + BLOCK - 1) / BLOCK;
	check(cuLaunchKernel(fn, grid, 1, 1, BLOCK, 1, 1, 0, NULL, args, NULL), "cuLaunchKernel");
	check(cuCtxSynchronize(), "cuCtxSynchronize");
	check(cuMemcpyDtoH(out, dy, bytes), "cuMemcpyDtoH");
	size_t wrong = 0;
	for (uint32_t i = 0; i < N; i++) {
		if (out[i] != a * x[i] + y[i]) {
			if (wrong++ == 0) {
				printf("first wrong element: y[%u] = %g, want %g\n", i, out[i], a * x[i] + y[i]);
			}
		}
	}
	if (wrong > 0) {
		printf("saxpy: %zu of %u elements wrong\n", wrong, N);
		return 1;
	}
	printf("saxpy: %u elements exact\n", N);

	CUevent start, stop;
	check(cuEventCreate(&start, 0), "cuEventCreate");
	check(cuEventCreate(&stop, 0), "cuEventCreate");
	check(cuEventRecord(start, NULL), "cuEventRecord");
	for (int i = 0; i < LAUNCHES; i++) {
		check(cuLaunchKernel(fn, grid, 1, 1, BLOCK, 1, 1, 0, NULL, args, NULL), "cuLaunchKernel");
	}
	check(cuEventRecord(stop, NULL), "cuEventRecord");
	check(cuEventSynchronize(stop), "cuEventSynchronize");
	float ms = 0;
	check(cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
	/* Each launch reads x and y and writes y. */
	double gbs = 3.0 * bytes * LAUNCHES / (ms / 1e3) / 1e9;
	printf("saxpy bandwidth: %.1f GB/s (%d launches, %.3f ms)\n", gbs, LAUNCHES, ms);
	cuMemFree(dx);
	cuMemFree(dy);
	return 0;
}
