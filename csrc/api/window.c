/*
 * window.c -- windows: while one is open anywhere in the process, torch
 * holds expandable segments as it says (off wins over on), and the
 * configuration from before comes back when the last one closes.
 *
 * The counts are kept per thread as well as in total, so that a child
 * forked inside another thread's window drops that window (state.c); a
 * window closed by another thread than the one that opened it (an async
 * task moved between threads) is taken off whichever thread has one.
 * The Window type is in C so that `with` calls __enter__/__exit__ without
 * a Python frame: a window then costs little more than its two writes.
 */
#include "api/window.h"
#include "state/errors.h"
#include "torchio/torch.h"

#include <stdlib.h>

/* ------------------------------------------------------------------ */
/* Counting                                                             */
/* ------------------------------------------------------------------ */

/* The count of thread `me` in st (created), or NULL when out of
 * memory. */
static ac_opener *
opener_of(ac_state *st, unsigned long me)
{
    size_t i;
    for (i = 0; i < st->n_openers; i++) {
        if (st->openers[i].thread == me) {
            return &st->openers[i];
        }
    }
    if (st->n_openers == st->cap_openers) {
        size_t cap = st->cap_openers ? 2 * st->cap_openers : 4;
        ac_opener *p = realloc(st->openers, cap * sizeof(ac_opener));
        if (p == NULL) {
            return NULL;
        }
        st->openers = p;
        st->cap_openers = cap;
    }
    st->openers[st->n_openers] = (ac_opener){me, 0, 0};
    return &st->openers[st->n_openers++];
}

/* The count of `me` if it has a window of this kind open, else any
 * thread's that has; NULL when none has. */
static ac_opener *
closer_of(ac_state *st, unsigned long me, int enabled)
{
    ac_opener *any = NULL;
    size_t i;
    for (i = 0; i < st->n_openers; i++) {
        ac_opener *o = &st->openers[i];
        if ((enabled ? o->on : o->off) == 0) {
            continue;
        }
        if (o->thread == me) {
            return o;
        }
        any = any ? any : o;
    }
    return any;
}

/* Drop the entry o when it counts nothing. */
static void
opener_tidy(ac_state *st, ac_opener *o)
{
    if (o->off == 0 && o->on == 0) {
        *o = st->openers[--st->n_openers];
    }
}

int
ac_window(ac_state *st, int enabled, int enter)
{
    unsigned long me = PyThread_get_thread_ident();
    ac_opener *o;
    Py_ssize_t *total, *mine;
    PyObject *exc = NULL, *target = NULL;
    unsigned mask;
    int reentered = 0;

    /* What torch holds now, in case a write went past allocconf: the
     * window builds on it, and gives it back when it closes. */
    if (ac_lock_read_back(st) < 0) {
        return -1;
    }
    o = enter ? opener_of(st, me) : closer_of(st, me, enabled);
    if (o == NULL) {
        ac_unlock(st);
        if (enter) {
            PyErr_NoMemory();
            return -1;
        }
        PyErr_Format(PyExc_RuntimeError,
                     "allocconf: an expandable_segments(%s) window was "
                     "closed more often than it was opened",
                     enabled ? "True" : "False");
        return -1;
    }
    total = enabled ? &st->n_on : &st->n_off;
    mine = enabled ? &o->on : &o->off;
    *total += enter ? 1 : -1;
    *mine += enter ? 1 : -1;
    if (ac_sync_locked(st, enter ? (enabled ? "window on" : "window off")
                                 : "window closed") < 0) {
        exc = PyErr_GetRaisedException();
        target = Py_NewRef(ac_target_locked(st, &mask));
        reentered = st->reentered;
        if (enter) { /* not opened after all */
            (*total)--;
            (*mine)--;
        }
    }
    opener_tidy(st, o);
    ac_unlock(st);
    if (exc != NULL) {
        ac_raise_write_failed(st, target, exc, reentered);
        Py_DECREF(target);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* The Window type                                                      */
/* ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD int enabled;
} window_object;

static int
window_init(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"enabled", NULL};
    PyObject *enabled;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:expandable_segments",
                                     kwlist, &enabled)) {
        return -1;
    }
    if (!PyBool_Check(enabled)) {
        PyErr_Format(PyExc_TypeError,
                     "allocconf.expandable_segments() takes True or False, "
                     "not %R",
                     enabled);
        return -1;
    }
    ((window_object *)self)->enabled = enabled == Py_True;
    return 0;
}

/* The PyCMethod signature is fixed, kwnames included. */
static PyObject *
window_enter(PyObject *self, PyTypeObject *defining_class,
             PyObject *const *args, Py_ssize_t nargs,
             PyObject *kwnames) // cppcheck-suppress constParameter
{
    ac_state *st = PyType_GetModuleState(defining_class);

    (void)args;
    if (nargs != 0 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "__enter__() takes no arguments");
        return NULL;
    }
    if (ac_window(st, ((window_object *)self)->enabled, 1) < 0) {
        return NULL;
    }
    return Py_NewRef(self);
}

static PyObject *
window_exit(PyObject *self, PyTypeObject *defining_class,
            PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    ac_state *st = PyType_GetModuleState(defining_class);

    (void)args;
    (void)nargs; /* exc_type, exc, tb: the window closes whatever happened */
    (void)kwnames;
    if (ac_window(st, ((window_object *)self)->enabled, 0) < 0) {
        return NULL;
    }
    Py_RETURN_NONE; /* falsy: an exception propagates */
}

static PyObject *
window_get_enabled(PyObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(((window_object *)self)->enabled);
}

static int
window_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self)); /* a heap type's instances own a reference */
    return 0;
}

static void
window_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMethodDef window_methods[] = {
    {"__enter__", (PyCFunction)(void (*)(void))window_enter,
     METH_METHOD | METH_FASTCALL | METH_KEYWORDS,
     PyDoc_STR("Open the window.")},
    {"__exit__", (PyCFunction)(void (*)(void))window_exit,
     METH_METHOD | METH_FASTCALL | METH_KEYWORDS,
     PyDoc_STR("Close the window; exceptions propagate.")},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef window_getset[] = {
    {"enabled", window_get_enabled, NULL,
     PyDoc_STR("The value held while the window is open."), NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot window_slots[] = {
    {Py_tp_doc,
     (void *)PyDoc_STR(
         "Window(enabled)\n--\n\n"
         "Holds expandable segments at `enabled` while open (the base of\n"
         "allocconf.expandable_segments).")},
    {Py_tp_init, window_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_methods, window_methods},
    {Py_tp_getset, window_getset},
    {Py_tp_traverse, window_traverse},
    {Py_tp_dealloc, window_dealloc},
    {0, NULL},
};

PyType_Spec ac_window_spec = {
    .name = "allocconf._C.Window",
    .basicsize = sizeof(window_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = window_slots,
};
