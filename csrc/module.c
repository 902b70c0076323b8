/*
 * module.c -- allocconf._C: the method table, argument parsing, the
 * module state's life cycle and PEP 489 multi-phase init.  The work is
 * done in conf.c (grammar), apply.c (state and writes) and cuda.c (the
 * CUDA driver, on demand).
 */
#include "apply.h"
#include "cuda.h"

#include <stdlib.h>
#include <string.h>

static inline ac_state *
get_state(PyObject *module)
{
    return (ac_state *)PyModule_GetState(module);
}

/* ------------------------------------------------------------------ */
/* Grammar                                                              */
/* ------------------------------------------------------------------ */

/* Parse the str `conf` into *out; 0, or -1 with AllocConfError set. */
static int
parse_str(ac_state *st, PyObject *conf, ac_conf *out)
{
    ac_error err;
    Py_ssize_t n;
    const char *s;

    if (!PyUnicode_Check(conf)) {
        PyErr_Format(PyExc_TypeError,
                     "allocconf: a configuration must be a str, not %.100s",
                     Py_TYPE(conf)->tp_name);
        return -1;
    }
    s = PyUnicode_AsUTF8AndSize(conf, &n);
    if (s == NULL) {
        return -1;
    }
    if (ac_conf_parse(s, (size_t)n, out, &err) < 0) {
        ac_raise(st, &err, conf);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(
    parse_doc,
    "parse(conf, /)\n--\n\n"
    "Parse an allocator configuration string into a dict of key -> value\n"
    "text, as torch reads it: later duplicates win, unknown keys are kept.\n"
    "Raises AllocConfError (a ValueError) naming the key, the character\n"
    "offset and the offending text.");

static PyObject *
parse(PyObject *module, PyObject *conf)
{
    ac_conf c = {NULL, 0, 0};
    PyObject *d = NULL;
    size_t i;

    if (parse_str(get_state(module), conf, &c) < 0) {
        return NULL;
    }
    d = PyDict_New();
    for (i = 0; d != NULL && i < c.len; i++) {
        PyObject *v = PyUnicode_FromString(c.items[i].value);
        if (v == NULL || PyDict_SetItemString(d, c.items[i].key, v) < 0) {
            Py_CLEAR(d);
        }
        Py_XDECREF(v);
    }
    ac_conf_clear(&c);
    return d;
}

PyDoc_STRVAR(
    merge_doc,
    "merge(base, /, **overrides)\n--\n\n"
    "Return `base` with the keyword overrides applied: a named key keeps its\n"
    "place (a new one goes last), None removes it, everything else is kept\n"
    "in order.  Values may be str, bool, int, float, or a dict/list for\n"
    "roundup_power2_divisions.  Raises AllocConfError for a bad base or\n"
    "value.");

static PyObject *
merge(PyObject *module, PyObject *args, PyObject *kwargs)
{
    ac_state *st = get_state(module);
    PyObject *base, *r = NULL;
    ac_conf c = {NULL, 0, 0};

    if (!PyArg_ParseTuple(args, "U:merge", &base) ||
        parse_str(st, base, &c) < 0) {
        return NULL;
    }
    if (kwargs == NULL || ac_apply_overrides(st, &c, kwargs) == 0) {
        r = ac_checked_string(st, &c, NULL);
    }
    ac_conf_clear(&c);
    return r;
}

/* ------------------------------------------------------------------ */
/* State                                                                */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(
    configure_doc,
    "configure(conf=None, /, **overrides)\n--\n\n"
    "Merge `conf` and the keyword overrides into the current configuration\n"
    "and write the full result to torch (or when torch is imported).\n"
    "Returns the configuration.  Raises AllocConfError for bad input, with\n"
    "nothing changed.");

static PyObject *
configure(PyObject *module, PyObject *args, PyObject *kwargs)
{
    PyObject *conf = Py_None;

    if (!PyArg_ParseTuple(args, "|O:configure", &conf)) {
        return NULL;
    }
    if (conf != Py_None && !PyUnicode_Check(conf)) {
        return PyErr_Format(PyExc_TypeError,
                            "allocconf: configure() takes a str or None, "
                            "not %.100s",
                            Py_TYPE(conf)->tp_name);
    }
    return ac_configure(get_state(module), conf == Py_None ? NULL : conf,
                        kwargs);
}

PyDoc_STRVAR(status_doc, "status()\n--\n\n"
                         "A dict with the fields of allocconf.Status.");

static PyObject *
status(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return ac_status(get_state(module));
}

PyDoc_STRVAR(
    load_environ_doc,
    "_load_environ()\n--\n\n"
    "Read the environment; return the warnings to give, as a list of str.");

static PyObject *
load_environ(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return ac_load_environ(get_state(module));
}

PyDoc_STRVAR(
    attach_doc,
    "_attach(torch, /)\n--\n\n"
    "Take the imported torch module and write allocconf's configuration;\n"
    "return the warnings to give, as a list of str.");

static PyObject *
attach(PyObject *module, PyObject *torch)
{
    return ac_attach(get_state(module), torch);
}

PyDoc_STRVAR(
    live_config_doc,
    "_live_config(torch, /)\n--\n\n"
    "The configuration string torch holds, or None where it cannot tell\n"
    "without initialising CUDA.");

static PyObject *
live_config(PyObject *module, PyObject *torch)
{
    PyObject *r = ac_read_live(torch);
    (void)module;
    if (r == NULL) {
        Py_RETURN_NONE;
    }
    return r;
}

/* ------------------------------------------------------------------ */
/* Window: the context manager behind expandable_segments()/ipc_safe()   */
/* ------------------------------------------------------------------ */

/* In C so that `with` calls __enter__/__exit__ without a Python frame:
 * a window then costs little more than the two setter calls it makes. */
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

static PyType_Spec window_spec = {
    .name = "allocconf._C.Window",
    .basicsize = sizeof(window_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = window_slots,
};

PyDoc_STRVAR(trace_doc,
             "_trace(message, /)\n--\n\n"
             "Write `message` to stderr when ALLOCCONF_DEBUG is on.");

static PyObject *
trace(PyObject *module, PyObject *msg)
{
    const char *s = PyUnicode_AsUTF8(msg);
    if (s == NULL) {
        return NULL;
    }
    ac_trace(get_state(module), s);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ */
/* The CUDA driver                                                      */
/* ------------------------------------------------------------------ */

PyDoc_STRVAR(
    driver_info_doc,
    "driver_info()\n--\n\n"
    "Ask the CUDA driver (loaded now, never at import) about each device.\n"
    "Returns a dict: 'driver' (None when there is none), 'version',\n"
    "'error', and 'devices', a list of dicts with 'index', 'name',\n"
    "'capability', 'vmm' and 'posix_fd_handles'.");

static PyObject *
driver_info(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    return cu_driver_info();
}

PyDoc_STRVAR(
    pointer_ipc_capable_doc,
    "_pointer_ipc_capable(ptr, /)\n--\n\n"
    "Whether device pointer `ptr` can be shared by classic CUDA IPC, asked\n"
    "of the driver.  Raises RuntimeError when the driver cannot tell.");

static PyObject *
pointer_ipc_capable(PyObject *module, PyObject *ptr)
{
    unsigned long long p = PyLong_AsUnsignedLongLong(ptr);
    int r;

    (void)module;
    if (p == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    r = cu_pointer_ipc_capable(p);
    if (r < 0) {
        return NULL;
    }
    return PyBool_FromLong(r);
}

PyDoc_STRVAR(
    pidfd_probe_doc,
    "pidfd_probe()\n--\n\n"
    "Try pidfd_open on this process and pidfd_getfd on one of its own\n"
    "descriptors, which is what torch's receiver does to map expandable\n"
    "segments.  Returns a dict: 'ok' (bool, or None where the system has no\n"
    "pidfd), 'step' and 'error'.");

static PyObject *
pidfd_probe(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    return cu_pidfd_probe();
}

/* ------------------------------------------------------------------ */
/* Module                                                               */
/* ------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"parse", (PyCFunction)parse, METH_O, parse_doc},
    {"merge", (PyCFunction)(void (*)(void))merge, METH_VARARGS | METH_KEYWORDS,
     merge_doc},
    {"configure", (PyCFunction)(void (*)(void))configure,
     METH_VARARGS | METH_KEYWORDS, configure_doc},
    {"status", status, METH_NOARGS, status_doc},
    {"driver_info", driver_info, METH_NOARGS, driver_info_doc},
    {"pidfd_probe", pidfd_probe, METH_NOARGS, pidfd_probe_doc},
    {"_pointer_ipc_capable", pointer_ipc_capable, METH_O,
     pointer_ipc_capable_doc},
    {"_load_environ", load_environ, METH_NOARGS, load_environ_doc},
    {"_attach", attach, METH_O, attach_doc},
    {"_live_config", live_config, METH_O, live_config_doc},
    {"_trace", trace, METH_O, trace_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(
    error_doc,
    "A configuration string was rejected.  Attributes: key (or None),\n"
    "offset (character offset of the fault), text (the offending text) and\n"
    "conf (the whole string).");

PyDoc_STRVAR(
    warning_doc,
    "allocconf could not do what it would have done (at import, or when\n"
    "torch was imported); the allocator was left as it was.");

static int
module_exec(PyObject *m)
{
    ac_state *st = get_state(m);
    PyObject *defaults, *window_type;
    int rc;

#if PY_VERSION_HEX < 0x030D0000
    st->mutex = PyThread_allocate_lock();
    if (st->mutex == NULL) {
        PyErr_NoMemory();
        return -1;
    }
#endif
    defaults = Py_BuildValue("{sOsOsOsO}", "key", Py_None, "offset", Py_None,
                             "text", Py_None, "conf", Py_None);
    if (defaults == NULL) {
        return -1;
    }
    st->error_type = PyErr_NewExceptionWithDoc(
        "allocconf.AllocConfError", error_doc, PyExc_ValueError, defaults);
    Py_DECREF(defaults);
    if (st->error_type == NULL) {
        return -1;
    }
    st->warning_type = PyErr_NewExceptionWithDoc(
        "allocconf.AllocConfWarning", warning_doc, PyExc_UserWarning, NULL);
    if (st->warning_type == NULL) {
        return -1;
    }
    if (ac_init_keys(st) < 0) {
        return -1;
    }
    st->auto_on = 1;
    st->base_es = -1;
    window_type = PyType_FromModuleAndSpec(m, &window_spec, NULL);
    if (window_type == NULL) {
        return -1;
    }
    rc = PyModule_AddObjectRef(m, "Window", window_type);
    Py_DECREF(window_type);
    if (rc < 0) {
        return -1;
    }
    if (PyModule_AddObjectRef(m, "AllocConfError", st->error_type) < 0 ||
        PyModule_AddObjectRef(m, "AllocConfWarning", st->warning_type) < 0) {
        return -1;
    }
    return 0;
}

static int
module_traverse(PyObject *m, visitproc visit, void *arg)
{
    ac_state *st = get_state(m);
    size_t i;
    if (st == NULL) {
        return 0;
    }
    Py_VISIT(st->error_type);
    Py_VISIT(st->warning_type);
    for (i = 0; i < AC_NKEYS; i++) {
        Py_VISIT(st->status_keys[i]);
    }
    Py_VISIT(st->setter);
    Py_VISIT(st->api);
    Py_VISIT(st->torch_version);
    Py_VISIT(st->user_raw);
    Py_VISIT(st->env_raw);
    Py_VISIT(st->env_seen);
    Py_VISIT(st->block_detail);
    Py_VISIT(st->str_base);
    Py_VISIT(st->str_on);
    Py_VISIT(st->str_off);
    Py_VISIT(st->in_force);
    return 0;
}

static int
module_clear(PyObject *m)
{
    ac_state *st = get_state(m);
    size_t i;
    if (st == NULL) {
        return 0;
    }
    Py_CLEAR(st->error_type);
    Py_CLEAR(st->warning_type);
    for (i = 0; i < AC_NKEYS; i++) {
        Py_CLEAR(st->status_keys[i]);
    }
    Py_CLEAR(st->setter);
    Py_CLEAR(st->api);
    Py_CLEAR(st->torch_version);
    Py_CLEAR(st->user_raw);
    Py_CLEAR(st->env_raw);
    Py_CLEAR(st->env_seen);
    Py_CLEAR(st->block_detail);
    Py_CLEAR(st->str_base);
    Py_CLEAR(st->str_on);
    Py_CLEAR(st->str_off);
    Py_CLEAR(st->in_force);
    return 0;
}

static void
module_free(void *m)
{
    ac_state *st = get_state((PyObject *)m);
    if (st == NULL) {
        return;
    }
    module_clear((PyObject *)m);
    ac_conf_clear(&st->user);
#if PY_VERSION_HEX < 0x030D0000
    if (st->mutex != NULL) {
        PyThread_free_lock(st->mutex);
        st->mutex = NULL;
    }
#endif
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, module_exec},
#ifdef Py_mod_multiple_interpreters
    /* torch's allocator is one per process: one module state only. */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
#ifdef Py_mod_gil
    /* The state is locked, but the lock's re-entry check reads its owner
     * under the GIL, and torch's setter is not known to be free-threading
     * safe: keep the GIL. */
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL},
};

PyDoc_STRVAR(
    module_doc,
    "allocconf's C core: the allocator configuration grammar, the state and\n"
    "its lock, the writes through torch's setter, and the CUDA driver\n"
    "questions.  Use it through the allocconf package.");

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,         .m_name = "allocconf._C",
    .m_doc = module_doc,           .m_size = sizeof(ac_state),
    .m_methods = methods,          .m_slots = slots,
    .m_traverse = module_traverse, .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC
PyInit__C(void)
{
    return PyModuleDef_Init(&moduledef);
}
