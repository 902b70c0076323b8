/*
 * neighbours.c -- the default stepping back for a neighbour that cannot
 * live with expandable segments (docs/neighbours.md).
 *
 * Which components count as neighbours, and why, is decided in one place
 * on the Python side (allocconf/_neighbours.py), which also watches the
 * imports; this file only changes the state, under its lock.
 */
#include "api/neighbours.h"
#include "torchio/torch.h"

PyObject *
ac_neighbour(ac_state *st, PyObject *name, PyObject *why)
{
    int stepped = 0;

    if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(why)) {
        PyErr_SetString(PyExc_TypeError,
                        "allocconf._C._neighbour(name, why) takes two str");
        return NULL;
    }
    if (ac_lock_read_back(st) < 0) {
        return NULL;
    }
    /* Exact str keys: hashing and comparing them runs no Python code. */
    if (PyDict_SetItem(st->neighbours, name, why) < 0) {
        goto error;
    }
    /* Only allocconf's own default steps back: not the user's choice, not
     * a write by another component, not a fall-back on what torch held. */
    if (st->stepped_back == NULL && st->step_back && st->auto_on &&
        st->block == AC_OK && st->refused == NULL && ac_layers_es(st) < 0) {
        st->stepped_back = Py_NewRef(name);
        if (ac_rebuild_locked(st) < 0 ||
            ac_sync_locked(st, "stepped back for a neighbour; wrote") < 0) {
            PyObject *exc = PyErr_GetRaisedException();
            Py_CLEAR(st->stepped_back);
            if (ac_rebuild_locked(st) < 0) {
                PyErr_Clear();
            }
            PyErr_SetRaisedException(exc);
            goto error;
        }
        stepped = 1;
    }
    ac_unlock(st);
    return PyBool_FromLong(stepped);
error:
    ac_unlock(st);
    return NULL;
}
