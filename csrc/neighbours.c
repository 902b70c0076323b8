/*
 * neighbours.c -- living with the other components of the process
 * (DESIGN.md behaviours 8 and 9): the default stepping back for a
 * neighbour that cannot live with expandable segments, and writes that
 * other components make through torch's setter, kept key for key.
 *
 * Which components count as neighbours, and why, is decided in one place
 * on the Python side (allocconf/_neighbours.py), which also watches the
 * imports; this file only changes the state, under its lock.
 */
#include "neighbours.h"
#include "config.h"
#include "torch.h"

PyObject *
ac_neighbour(ac_state *st, PyObject *name, PyObject *why)
{
    int stepped = 0;

    if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(why)) {
        PyErr_SetString(PyExc_TypeError,
                        "allocconf._C._neighbour(name, why) takes two str");
        return NULL;
    }
    if (ac_lock(st) < 0) {
        return NULL;
    }
    /* Exact str keys: hashing and comparing them runs no Python code. */
    if (PyDict_SetItem(st->neighbours, name, why) < 0) {
        goto error;
    }
    /* Only allocconf's own default steps back: not the user's choice, not
     * a write by another component, not a fall-back on what torch held. */
    if (st->stepped_back == NULL && st->step_back && st->auto_on &&
        st->block == AC_OK && st->refused == NULL &&
        ac_conf_es(&st->user) < 0) {
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

PyObject *
ac_foreign_write(ac_state *st, PyObject *writer, PyObject *s)
{
    ac_conf add = {NULL, 0, 0};
    ac_outcome o = {NULL, NULL, NULL};
    ac_error err;
    const char *u;
    Py_ssize_t n;
    PyObject *result = NULL;
    int mergeable;

    if (!PyUnicode_CheckExact(writer) || !PyUnicode_CheckExact(s)) {
        Py_RETURN_NOTIMPLEMENTED; /* torch gives its own TypeError */
    }
    u = PyUnicode_AsUTF8AndSize(s, &n);
    if (u == NULL) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    /* Parsed before the lock.  backend is read by torch once, at load: a
     * write naming it is torch's to judge. */
    mergeable = ac_conf_parse(u, (size_t)n, &add, &err) == 0 &&
                ac_conf_get(&add, "backend") == NULL;
    if (ac_lock(st) < 0) {
        ac_conf_clear(&add);
        return NULL;
    }
    if (!st->attached || st->block != AC_OK || st->setter == NULL) {
        /* allocconf writes nothing here: the caller calls torch itself. */
        result = Py_NewRef(Py_NotImplemented);
    }
    else if (mergeable && (result = ac_merge_write_locked(
                               st, &add, NULL, writer, 1, &o)) != NULL) {
        /* Kept: the caller returns None, as torch's setter does. */
        Py_SETREF(result, Py_NewRef(Py_None));
        st->foreign++;
    }
    else if (o.torch_exc == NULL) {
        /* allocconf cannot merge it (its grammar is stricter than
         * torch's about stray separators, or a rule between keys fails):
         * torch decides, on the string exactly as given. */
        PyErr_Clear();
        Py_CLEAR(o.refusal);
        if (ac_write_as_is_locked(
                st, s, "a write by another component, as given:") == 0) {
            st->foreign++;
            result = Py_NewRef(Py_None);
        }
    }
    ac_unlock(st);
    ac_conf_clear(&add);
    Py_XDECREF(o.refusal);
    Py_XDECREF(o.target);
    if (o.torch_exc != NULL) {
        /* The caller sees torch's own error, as without allocconf. */
        PyErr_SetRaisedException(o.torch_exc);
        return NULL;
    }
    return result;
}
