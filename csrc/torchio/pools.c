/*
 * pools.c -- the calls into torch behind a window of the opener's scope
 * (api/scoped.c): is CUDA up, which device is current, make a pool, and
 * route the calling thread's allocations to it and back.  The callables
 * are torch's own (torch._C's pool routing, torch.cuda.is_initialized),
 * handed over with allocconf._pools.make in one tuple when torch is
 * attached; nothing here is looked up per call.
 */
#include "torchio/torch.h"

/* The places in the tuple (allocconf/_pools.py builds it). */
enum {
    API_BEGIN,
    API_END,
    API_RELEASE,
    API_DEVICE,
    API_CUDA_UP,
    API_MAKE,
};

/* Call api[i](device, id) and drop the result; 0, or -1. */
static int
call_with_id(PyObject *api, int i, int device, PyObject *id)
{
    PyObject *r =
        PyObject_CallFunction(PyTuple_GET_ITEM(api, i), "iO", device, id);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

int
ac_pools_cuda_up(PyObject *api)
{
    PyObject *r = PyObject_CallNoArgs(PyTuple_GET_ITEM(api, API_CUDA_UP));
    int up;
    if (r == NULL) {
        return -1;
    }
    up = PyObject_IsTrue(r);
    Py_DECREF(r);
    return up;
}

int
ac_pools_current_device(PyObject *api)
{
    PyObject *r = PyObject_CallNoArgs(PyTuple_GET_ITEM(api, API_DEVICE));
    long device;
    if (r == NULL) {
        return -1;
    }
    device = PyLong_AsLong(r);
    Py_DECREF(r);
    if (device == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (device < 0 || device > 0x7fff) {
        PyErr_Format(PyExc_RuntimeError,
                     "allocconf: torch names device %ld as current", device);
        return -1;
    }
    return (int)device;
}

PyObject *
ac_pools_make(PyObject *api, int device)
{
    return PyObject_CallFunction(PyTuple_GET_ITEM(api, API_MAKE), "i", device);
}

int
ac_pools_begin(PyObject *api, int device, PyObject *id)
{
    return call_with_id(api, API_BEGIN, device, id);
}

int
ac_pools_end(PyObject *api, int device, PyObject *id)
{
    int rc = call_with_id(api, API_END, device, id);
    /* begin took a hold on the pool (its use count): it is given back
     * whatever end said. */
    if (rc < 0) {
        PyObject *exc = PyErr_GetRaisedException();
        (void)call_with_id(api, API_RELEASE, device, id);
        PyErr_Clear();
        PyErr_SetRaisedException(exc);
        return -1;
    }
    return call_with_id(api, API_RELEASE, device, id);
}
