/*
 * window_type.c -- the Window type behind allocconf.expandable_segments()
 * and ipc_safe(), in C so that `with` calls __enter__/__exit__ without a
 * Python frame: a window then costs little more than its work, the two
 * writes of a process-wide window (window.c) or the route of one of the
 * opener's scope (scoped.c).
 */
#include "api/scoped.h"
#include "api/window.h"

typedef struct {
    PyObject_HEAD int enabled;
    int opener; /* ipc_safe()'s default scope: api/scoped.c */
} window_object;

static int
window_init(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"enabled", "opener", NULL};
    PyObject *enabled;
    int opener = 0;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$p:expandable_segments",
                                     kwlist, &enabled, &opener)) {
        return -1;
    }
    if (!PyBool_Check(enabled)) {
        PyErr_Format(PyExc_TypeError,
                     "allocconf.expandable_segments() takes True or False, "
                     "not %R",
                     enabled);
        return -1;
    }
    if (opener && enabled == Py_True) {
        PyErr_SetString(PyExc_ValueError,
                        "allocconf: a window that holds expandable segments "
                        "on is process-wide (a pool cannot make memory "
                        "expandable)");
        return -1;
    }
    ((window_object *)self)->enabled = enabled == Py_True;
    ((window_object *)self)->opener = opener;
    return 0;
}

/* Open or close the window `self`, of its scope. */
static int
window_act(ac_state *st, PyObject *self, int enter)
{
    const window_object *w = (const window_object *)self;
    return w->opener ? ac_scoped_window(st, enter)
                     : ac_window(st, w->enabled, enter);
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
    if (window_act(st, self, 1) < 0) {
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
    if (window_act(st, self, 0) < 0) {
        return NULL;
    }
    Py_RETURN_NONE; /* falsy: an exception propagates */
}

static PyObject *
window_get_enabled(PyObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(((window_object *)self)->enabled);
}

static PyObject *
window_get_opener(PyObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(((window_object *)self)->opener);
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
    {"opener", window_get_opener, NULL,
     PyDoc_STR("Whether the window covers its opener only (ipc_safe()'s "
               "default scope) rather than the whole process."),
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot window_slots[] = {
    {Py_tp_doc,
     (void *)PyDoc_STR(
         "Window(enabled, *, opener=False)\n--\n\n"
         "Holds expandable segments at `enabled` while open, for the whole\n"
         "process; with `opener` (enabled False only), routes the opening\n"
         "thread's allocations to allocconf's pools instead (the base of\n"
         "allocconf.expandable_segments and ipc_safe()).")},
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
