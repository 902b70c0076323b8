/*
 * alloc.c -- classic device memory for allocconf's pools (see alloc.h).
 *
 * Each allocation is one cuMemAlloc in the primary context of the device
 * torch names, pushed for the call and popped after, so the memory is
 * what classic CUDA IPC shares (cudaIpcGetMemHandle), whatever torch's
 * allocator does elsewhere.  torch's pool caches what these return, as
 * its own pools cache cudaMalloc's, so they run when a pool grows or
 * gives memory back, not per tensor.
 *
 * The driver is found once, with RTLD_NOLOAD first (torch has loaded it
 * by the time a pool allocates), and never closed; the table is written
 * once under pthread_once and only read after.  The byte counts are
 * atomics: torch calls these from any thread, without the GIL.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* as pyconfig.h spells it: no redefinition */
#endif
#include "driver/alloc.h"

#include <stdint.h>
#include <string.h>

#if defined(__linux__) && !defined(__STDC_NO_ATOMICS__)
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#define AC_HAVE_POOL 1
#endif

#ifdef AC_HAVE_POOL

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

typedef struct {
    CUresult (*init)(unsigned int);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_count)(int *);
    CUresult (*ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_release)(CUdevice);
    CUresult (*ctx_state)(CUdevice, unsigned int *, int *);
    CUresult (*ctx_push)(CUcontext);
    CUresult (*ctx_pop)(CUcontext *);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    int usable; /* every symbol found */
} pool_driver;

static pool_driver the_driver; /* written once, by load_driver */
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static atomic_size_t held_bytes[AC_MAX_DEVICES];

static void
load_driver(void)
{
    static const char *const names[] = {
        "cuInit",
        "cuDeviceGet",
        "cuDeviceGetCount",
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease",
        "cuDevicePrimaryCtxGetState",
        "cuCtxPushCurrent_v2",
        "cuCtxPopCurrent_v2",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
    };
    void **slots[] = {
        (void **)&the_driver.init,         (void **)&the_driver.device_get,
        (void **)&the_driver.device_count, (void **)&the_driver.ctx_retain,
        (void **)&the_driver.ctx_release,  (void **)&the_driver.ctx_state,
        (void **)&the_driver.ctx_push,     (void **)&the_driver.ctx_pop,
        (void **)&the_driver.mem_alloc,    (void **)&the_driver.mem_free,
    };
    size_t i;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

    if (lib == NULL) {
        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    }
    if (lib == NULL) {
        return;
    }
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *slots[i] = dlsym(lib, names[i]);
        if (*slots[i] == NULL) {
            return;
        }
    }
    the_driver.usable = 1;
}

/* The driver table, or NULL when there is no usable driver. */
static const pool_driver *
driver(void)
{
    if (pthread_once(&driver_once, load_driver) != 0 || !the_driver.usable) {
        return NULL;
    }
    return &the_driver;
}

/* Make the primary context of `device` current, held for the call (the
 * device's number in *dev for leave_device); 0, or -1. */
static int
enter_device(const pool_driver *d, int device, CUdevice *dev)
{
    CUcontext ctx = NULL;

    if (d->init(0) != 0 || d->device_get(dev, device) != 0 ||
        d->ctx_retain(&ctx, *dev) != 0) {
        return -1;
    }
    if (d->ctx_push(ctx) != 0) {
        (void)d->ctx_release(*dev);
        return -1;
    }
    return 0;
}

static void
leave_device(const pool_driver *d, CUdevice dev)
{
    CUcontext ctx;
    (void)d->ctx_pop(&ctx);
    (void)d->ctx_release(dev);
}

static int
counted(int device)
{
    return device >= 0 && device < AC_MAX_DEVICES;
}

AC_EXPORT void *
allocconf_pool_malloc(size_t size, int device, void *stream)
{
    const pool_driver *d = driver();
    CUdeviceptr ptr = 0;
    CUdevice dev;
    CUresult r;

    (void)stream;
    if (d == NULL || size == 0 || enter_device(d, device, &dev) < 0) {
        return NULL;
    }
    r = d->mem_alloc(&ptr, size);
    leave_device(d, dev);
    if (r != 0) {
        return NULL;
    }
    if (counted(device)) {
        atomic_fetch_add(&held_bytes[device], size);
    }
    return (void *)(uintptr_t)ptr;
}

AC_EXPORT void
allocconf_pool_free(void *ptr, size_t size, int device, void *stream)
{
    const pool_driver *d = driver();
    CUdevice dev;

    (void)stream;
    if (d == NULL || ptr == NULL || enter_device(d, device, &dev) < 0) {
        return;
    }
    if (d->mem_free((CUdeviceptr)(uintptr_t)ptr) == 0 && counted(device)) {
        atomic_fetch_sub(&held_bytes[device], size);
    }
    leave_device(d, dev);
}

size_t
cu_pool_bytes(void)
{
    size_t total = 0;
    int device;

    for (device = 0; device < AC_MAX_DEVICES; device++) {
        total += atomic_load(&held_bytes[device]);
    }
    return total;
}

unsigned long long
cu_active_devices(void)
{
    const pool_driver *d;
    unsigned long long mask = 0;
    int n = 0, i;

    d = driver();
    if (d == NULL || d->device_count(&n) != 0) {
        return 0;
    }
    for (i = 0; i < n && i < AC_MAX_DEVICES; i++) {
        CUdevice dev;
        unsigned int flags;
        int active = 0;
        if (d->device_get(&dev, i) == 0 &&
            d->ctx_state(dev, &flags, &active) == 0 && active) {
            mask |= 1ULL << i;
        }
    }
    return mask;
}

#else /* no pools on this platform: torch never calls these */

AC_EXPORT void *
allocconf_pool_malloc(size_t size, int device, void *stream)
{
    (void)size;
    (void)device;
    (void)stream;
    return NULL;
}

AC_EXPORT void
allocconf_pool_free(void *ptr, size_t size, int device, void *stream)
{
    (void)ptr;
    (void)size;
    (void)device;
    (void)stream;
}

size_t
cu_pool_bytes(void)
{
    return 0;
}

unsigned long long
cu_active_devices(void)
{
    return 0;
}

#endif
