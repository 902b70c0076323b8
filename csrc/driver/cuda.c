/*
 * cuda.c -- the CUDA driver, opened with dlopen when a question is asked,
 * and the pidfd probe (see cuda.h).
 *
 * Nothing is kept between calls: the library is opened with RTLD_NODELETE
 * (so closing it never unloads a driver that torch may be using) and
 * closed again.  Asking the driver calls cuInit, which torch would do
 * anyway; it is never done at import.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* as pyconfig.h spells it: no redefinition */
#endif
#include "driver/cuda.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#define AC_HAVE_DLOPEN 1
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
#endif

/* The driver API's types and the constants used, from cuda.h. */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    ATTR_CC_MAJOR = 75,
    ATTR_CC_MINOR = 76,
    ATTR_VMM = 102,
    ATTR_POSIX_FD = 103,
    PTR_IS_LEGACY_IPC_CAPABLE = 10,
};

typedef struct {
    void *lib;
    CUresult (*init)(unsigned int);
    CUresult (*driver_version)(int *);
    CUresult (*device_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_name)(char *, int, CUdevice);
    CUresult (*device_attribute)(int *, int, CUdevice);
    CUresult (*pointer_attribute)(void *, int, CUdeviceptr);
    CUresult (*error_string)(CUresult, const char **);
} driver;

/* A readable name for a CUresult. */
static const char *
cu_error(const driver *d, CUresult r)
{
    const char *s = NULL;
    if (d->error_string == NULL || d->error_string(r, &s) != CUDA_SUCCESS ||
        s == NULL) {
        return "unknown CUDA error";
    }
    return s;
}

static void
driver_close(driver *d)
{
#ifdef AC_HAVE_DLOPEN
    if (d->lib != NULL) {
        dlclose(d->lib);
    }
#endif
    memset(d, 0, sizeof(*d));
}

/* Open the driver and cuInit it.  Returns 1 when it is usable, 0 when it
 * is missing (why says so), -1 when it is there but cuInit failed (why
 * says why; d stays open so the caller can report the version). */
static int
driver_open(driver *d, char *why, size_t n)
{
    memset(d, 0, sizeof(*d));
#ifdef AC_HAVE_DLOPEN
    {
        static const char *const names[] = {
            "cuInit",
            "cuDriverGetVersion",
            "cuDeviceGetCount",
            "cuDeviceGet",
            "cuDeviceGetName",
            "cuDeviceGetAttribute",
            "cuPointerGetAttribute",
            "cuGetErrorString",
        };
        void **slots[] = {
            (void **)&d->init,
            (void **)&d->driver_version,
            (void **)&d->device_count,
            (void **)&d->device_get,
            (void **)&d->device_name,
            (void **)&d->device_attribute,
            (void **)&d->pointer_attribute,
            (void **)&d->error_string,
        };
        size_t i;
        CUresult r;

        d->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (d->lib == NULL) {
            const char *e = dlerror();
            snprintf(why, n, "no CUDA driver (%s)", e ? e : "not found");
            return 0;
        }
        for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            *slots[i] = dlsym(d->lib, names[i]);
            if (*slots[i] == NULL) {
                snprintf(why, n, "no CUDA driver (libcuda.so.1 lacks %s)",
                         names[i]);
                driver_close(d);
                return 0;
            }
        }
        r = d->init(0);
        if (r != CUDA_SUCCESS) {
            snprintf(why, n, "cuInit failed: %s", cu_error(d, r));
            return -1;
        }
        return 1;
    }
#else
    snprintf(why, n, "no CUDA driver (not supported on this platform)");
    return 0;
#endif
}

/* Set d[key] to a new reference `v` (stolen).  0 or -1. */
static int
put(PyObject *d, const char *key, PyObject *v)
{
    int rc;
    if (v == NULL) {
        return -1;
    }
    rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

/* A new dict for device `index`, or NULL. */
static PyObject *
device_dict(const driver *drv, int index)
{
    char name[256] = "";
    int major = -1, minor = -1, vmm = -1, fd = -1;
    CUdevice dev;
    PyObject *d = PyDict_New();

    if (d == NULL) {
        return NULL;
    }
    if (drv->device_get(&dev, index) == CUDA_SUCCESS) {
        if (drv->device_name(name, (int)sizeof(name) - 1, dev) !=
            CUDA_SUCCESS) {
            name[0] = '\0';
        }
        drv->device_attribute(&major, ATTR_CC_MAJOR, dev);
        drv->device_attribute(&minor, ATTR_CC_MINOR, dev);
        drv->device_attribute(&vmm, ATTR_VMM, dev);
        drv->device_attribute(&fd, ATTR_POSIX_FD, dev);
    }
    if (put(d, "index", PyLong_FromLong(index)) < 0 ||
        put(d, "name",
            PyUnicode_DecodeUTF8(name, (Py_ssize_t)strlen(name), "replace")) <
            0 ||
        put(d, "capability",
            major < 0 ? Py_NewRef(Py_None)
                      : PyUnicode_FromFormat("%d.%d", major, minor)) < 0 ||
        put(d, "vmm", vmm < 0 ? Py_NewRef(Py_None) : PyBool_FromLong(vmm)) <
            0 ||
        put(d, "posix_fd_handles",
            fd < 0 ? Py_NewRef(Py_None) : PyBool_FromLong(fd)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

PyObject *
cu_driver_info(void)
{
    char why[256] = "";
    driver drv;
    int opened = driver_open(&drv, why, sizeof(why)), version = 0, count = 0;
    int i;
    PyObject *d = PyDict_New(), *devices = PyList_New(0);

    if (d == NULL || devices == NULL) {
        goto error;
    }
    if (opened != 0 && drv.driver_version(&version) != CUDA_SUCCESS) {
        version = 0;
    }
    if (opened == 1) {
        CUresult r = drv.device_count(&count);
        if (r != CUDA_SUCCESS) {
            snprintf(why, sizeof(why), "cuDeviceGetCount failed: %s",
                     cu_error(&drv, r));
            count = 0;
        }
    }
    for (i = 0; i < count; i++) {
        PyObject *dev = device_dict(&drv, i);
        if (dev == NULL || PyList_Append(devices, dev) < 0) {
            Py_XDECREF(dev);
            goto error;
        }
        Py_DECREF(dev);
    }
    if (put(d, "driver",
            opened ? PyUnicode_FromString("libcuda.so.1")
                   : Py_NewRef(Py_None)) < 0 ||
        put(d, "version",
            version ? PyUnicode_FromFormat("%d.%d", version / 1000,
                                           (version % 1000) / 10)
                    : Py_NewRef(Py_None)) < 0 ||
        put(d, "error",
            why[0] ? PyUnicode_FromString(why) : Py_NewRef(Py_None)) < 0 ||
        PyDict_SetItemString(d, "devices", devices) < 0) {
        goto error;
    }
    Py_DECREF(devices);
    driver_close(&drv);
    return d;
error:
    Py_XDECREF(d);
    Py_XDECREF(devices);
    driver_close(&drv);
    return NULL;
}

int
cu_pointer_ipc_capable(unsigned long long ptr)
{
    char why[256] = "";
    driver drv;
    int opened = driver_open(&drv, why, sizeof(why)), value = 0;
    CUresult r;

    if (opened != 1) {
        PyErr_Format(PyExc_RuntimeError, "allocconf: %s", why);
        driver_close(&drv);
        return -1;
    }
    r = drv.pointer_attribute(&value, PTR_IS_LEGACY_IPC_CAPABLE,
                              (CUdeviceptr)ptr);
    if (r != CUDA_SUCCESS) {
        /* PyErr_Format knows no %llx before Python 3.12. */
        char hex[2 + 2 * sizeof(ptr) + 1];
        snprintf(hex, sizeof(hex), "0x%llx", ptr);
        PyErr_Format(PyExc_RuntimeError,
                     "allocconf: the CUDA driver cannot tell whether "
                     "%s can be shared: %s",
                     hex, cu_error(&drv, r));
        driver_close(&drv);
        return -1;
    }
    driver_close(&drv);
    return value != 0;
}

/* ------------------------------------------------------------------ */
/* pidfd                                                                */
/* ------------------------------------------------------------------ */

#if defined(__linux__)
/* Take descriptor `fd` of process `pid` with pidfd_open + pidfd_getfd.
 * Returns 0, or the errno of the step that failed with *step naming it. */
static int
grab_fd(pid_t pid, int fd, const char **step)
{
    int pidfd, got, e;

    *step = "pidfd_open";
    pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) {
        return errno;
    }
    *step = "pidfd_getfd";
    got = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
    e = got < 0 ? errno : 0;
    if (got >= 0) {
        close(got);
    }
    close(pidfd);
    return e;
}

/* Run grab_fd(getppid(), fd) in a forked child, as a receiver process
 * started by the sender would: the child reports its errno through a
 * pipe and exits at once (only system calls run in it). */
static int
grab_fd_from_child(int fd, const char **step)
{
    int p[2], result[2] = {-1, 0}, status;
    pid_t child;
    ssize_t got;

    *step = "fork";
    if (pipe(p) < 0) {
        return errno;
    }
    child = fork();
    if (child < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        return e;
    }
    if (child == 0) {
        const char *s = "";
        int out[2];
        close(p[0]);
        out[1] = grab_fd(getppid(), fd, &s);
        out[0] = strcmp(s, "pidfd_open") == 0 ? 1 : 2;
        if (write(p[1], out, sizeof(out)) < 0) {
            _exit(1);
        }
        _exit(0);
    }
    close(p[1]);
    do {
        got = read(p[0], result, sizeof(result));
    } while (got < 0 && errno == EINTR);
    close(p[0]);
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    if (got != (ssize_t)sizeof(result)) {
        *step = "fork";
        return EIO;
    }
    *step = result[0] == 1 ? "pidfd_open" : "pidfd_getfd";
    return result[1];
}
#endif

/* Put {"ok", "step", "error"} for one probe into d[key].  0 or -1. */
static int
put_probe(PyObject *d, const char *key, int err, const char *step)
{
    PyObject *r;
    if (err == ENOSYS) {
        r = Py_BuildValue("{sOssss}", "ok", Py_None, "step", step, "error",
                          "this kernel has no pidfd (Linux 5.6+ needed)");
    }
    else if (err != 0) {
        r = Py_BuildValue("{sOssss}", "ok", Py_False, "step", step, "error",
                          strerror(err));
    }
    else {
        r = Py_BuildValue("{sOsssO}", "ok", Py_True, "step", step, "error",
                          Py_None);
    }
    return put(d, key, r);
}

PyObject *
cu_pidfd_probe(void)
{
    PyObject *d = PyDict_New();
    if (d == NULL) {
        return NULL;
    }
#if defined(__linux__)
    {
        const char *step1 = "", *step2 = "";
        int p[2], e1, e2;

        if (pipe(p) < 0) {
            Py_DECREF(d);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        e1 = grab_fd(getpid(), p[0], &step1);
        e2 = grab_fd_from_child(p[0], &step2);
        close(p[0]);
        close(p[1]);
        if (put_probe(d, "self", e1, step1) < 0 ||
            put_probe(d, "child_to_parent", e2, step2) < 0 ||
            put(d, "ok",
                (e1 == ENOSYS || e2 == ENOSYS)
                    ? Py_NewRef(Py_None)
                    : PyBool_FromLong(e1 == 0 && e2 == 0)) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
#else
    if (put_probe(d, "self", ENOSYS, "pidfd_open") < 0 ||
        put_probe(d, "child_to_parent", ENOSYS, "pidfd_open") < 0 ||
        put(d, "ok", Py_NewRef(Py_None)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
#endif
    return d;
}
