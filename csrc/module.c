/*
 * module.c -- allocconf._C, the binding only: the method table, argument
 * parsing and PEP 489 multi-phase init.  It is the top of the layers of
 * csrc/ (docs/design.md, "Layers"), each using only those below it:
 *
 *   grammar/  the configuration grammar, plain C (fuzzed)     driver/
 *   state/    the state, its lock, and its pure transitions   the CUDA
 *   torchio/  writing to torch and reading it back            driver
 *   api/      windows, configure() and foreign writes,
 *             neighbours, status()
 */
#include "api/neighbours.h"
#include "api/scoped.h"
#include "api/status.h"
#include "api/window.h"
#include "api/writes.h"
#include "driver/alloc.h"
#include "driver/cuda.h"
#include "state/environ.h"
#include "state/errors.h"
#include "state/overrides.h"
#include "torchio/torch.h"

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

    ac_conf patch = {NULL, 0, 0};

    if (!PyArg_ParseTuple(args, "U:merge", &base) ||
        parse_str(st, base, &c) < 0) {
        return NULL;
    }
    if (ac_overrides_patch(st, kwargs, &patch) == 0) {
        if (ac_conf_update(&c, &patch) < 0) {
            PyErr_NoMemory();
        }
        else {
            r = ac_checked_string(st, &c, NULL);
        }
    }
    ac_conf_clear(&patch);
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
    ac_state *st = get_state(module);
    ac_conf patch = {NULL, 0, 0};
    PyObject *conf = Py_None, *r;

    if (!PyArg_ParseTuple(args, "|O:configure", &conf)) {
        return NULL;
    }
    if (conf != Py_None && !PyUnicode_Check(conf)) {
        return PyErr_Format(PyExc_TypeError,
                            "allocconf: configure() takes a str or None, "
                            "not %.100s",
                            Py_TYPE(conf)->tp_name);
    }
    /* Every value becomes text here, before the state is locked. */
    if (ac_overrides_patch(st, kwargs, &patch) < 0) {
        return NULL;
    }
    r = ac_configure(st, conf == Py_None ? NULL : conf, &patch);
    ac_conf_clear(&patch);
    return r;
}

PyDoc_STRVAR(neighbour_doc,
             "_neighbour(name, why, /)\n--\n\n"
             "Record the neighbour `name` (why: what expandable segments do "
             "to it);\nallocconf's default steps back unless someone chose. "
             "True when it\nstepped back now.");

static PyObject *
neighbour(PyObject *module, PyObject *args)
{
    PyObject *name, *why;

    if (!PyArg_ParseTuple(args, "UU:_neighbour", &name, &why)) {
        return NULL;
    }
    return ac_neighbour(get_state(module), name, why);
}

PyDoc_STRVAR(foreign_write_doc,
             "_foreign_write(writer, conf, /)\n--\n\n"
             "Another component called torch's setter with `conf`: keep the "
             "keys it\nnames, merged into the configuration.  None, or "
             "NotImplemented when\nthe caller must call torch itself.");

static PyObject *
foreign_write(PyObject *module, PyObject *args)
{
    PyObject *writer, *conf;

    if (!PyArg_ParseTuple(args, "OO:_foreign_write", &writer, &conf)) {
        return NULL;
    }
    return ac_foreign_write(get_state(module), writer, conf);
}

PyDoc_STRVAR(export_base_doc,
             "_export_base()\n--\n\n"
             "With ALLOCCONF_EXPORT=1 and torch attached, the configuration "
             "torch\nholds outside windows; else None.");

static PyObject *
export_base(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return ac_export_base(get_state(module));
}

PyDoc_STRVAR(internals_doc,
             "_internals()\n--\n\n"
             "allocconf's switches and the strings child_env() needs, as a "
             "dict.");

static PyObject *
internals(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return ac_internals(get_state(module));
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
    "_load_environ(torch=None, /)\n--\n\n"
    "Read the environment, as the torch module given (already imported)\n"
    "reads it, or as any torch may when None; return the warnings to\n"
    "give, as a list of str.");

static PyObject *
load_environ(PyObject *module, PyObject *args)
{
    PyObject *torch = Py_None;
    unsigned reads = 0;
    int generic = 0;

    if (!PyArg_ParseTuple(args, "|O:_load_environ", &torch)) {
        return NULL;
    }
    if (torch != Py_None && ac_torch_reads(torch, &reads, &generic) < 0) {
        return NULL;
    }
    return ac_load_environ(get_state(module), reads, generic);
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
    if (r == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return r;
}

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

PyDoc_STRVAR(after_fork_doc,
             "_after_fork()\n--\n\n"
             "Registered with os.register_at_fork(after_in_child=...) at "
             "import:\nin a child, a free lock and only the forking "
             "thread's windows;\nin the process that forked, nothing.");

static PyObject *
after_fork(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    ac_after_fork_child(get_state(module));
    Py_RETURN_NONE;
}

PyDoc_STRVAR(
    set_pools_doc,
    "_set_pools(api, why, /)\n--\n\n"
    "Take torch's pool routing for ipc_safe() windows of the opener's\n"
    "scope: the tuple (begin, end, release, current_device, initialized,\n"
    "make) that allocconf._pools.probe builds, or None when windows hold\n"
    "process-wide; `why` says which and why (status().window_scope_reason).");

static PyObject *
set_pools(PyObject *module, PyObject *args)
{
    PyObject *api, *why;

    if (!PyArg_ParseTuple(args, "OU:_set_pools", &api, &why) ||
        ac_set_pools(get_state(module), api, why) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(release_pools_doc,
             "_release_pools()\n--\n\n"
             "Let go of allocconf's pools (allocconf.release_pools).");

static PyObject *
release_pools(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    if (ac_release_pools(get_state(module)) < 0) {
        return NULL;
    }
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
    {"_load_environ", load_environ, METH_VARARGS, load_environ_doc},
    {"_attach", attach, METH_O, attach_doc},
    {"_live_config", live_config, METH_O, live_config_doc},
    {"_trace", trace, METH_O, trace_doc},
    {"_after_fork", after_fork, METH_NOARGS, after_fork_doc},
    {"_set_pools", set_pools, METH_VARARGS, set_pools_doc},
    {"_release_pools", release_pools, METH_NOARGS, release_pools_doc},
    {"_neighbour", neighbour, METH_VARARGS, neighbour_doc},
    {"_foreign_write", foreign_write, METH_VARARGS, foreign_write_doc},
    {"_internals", internals, METH_NOARGS, internals_doc},
    {"_export_base", export_base, METH_NOARGS, export_base_doc},
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

/* os.register_at_fork(after_in_child=module._after_fork), once: the
 * module is never executed twice in a process (state.c).  Where os has
 * no register_at_fork (some platforms and embedded interpreters),
 * st->at_fork stays 0 and the package warns.  0 or -1. */
static int
register_at_fork(PyObject *m, ac_state *st)
{
    PyObject *os = PyImport_ImportModule("os"), *reg = NULL, *fn = NULL;
    PyObject *args = NULL, *kwargs = NULL, *r = NULL;
    int rc = -1;

    if (os == NULL) {
        return -1;
    }
    if (PyObject_GetOptionalAttrString(os, "register_at_fork", &reg) < 0) {
        goto done;
    }
    if (reg == NULL) {
        rc = 0; /* nothing to register with */
        goto done;
    }
    fn = PyObject_GetAttrString(m, "_after_fork");
    args = fn == NULL ? NULL : PyTuple_New(0);
    kwargs = args == NULL ? NULL : Py_BuildValue("{sO}", "after_in_child", fn);
    r = kwargs == NULL ? NULL : PyObject_Call(reg, args, kwargs);
    if (r != NULL) {
        st->at_fork = 1;
        rc = 0;
    }
done:
    Py_DECREF(os);
    Py_XDECREF(reg);
    Py_XDECREF(fn);
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    Py_XDECREF(r);
    return rc;
}

static int
module_exec(PyObject *m)
{
    ac_state *st = get_state(m);
    PyObject *defaults, *window_type;
    int rc;

    if (ac_state_init(st) < 0) {
        return -1;
    }
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
    window_type = PyType_FromModuleAndSpec(m, &ac_window_spec, NULL);
    if (window_type == NULL) {
        return -1;
    }
    rc = PyModule_AddObjectRef(m, "Window", window_type);
    Py_DECREF(window_type);
    if (rc < 0 ||
        PyModule_AddStringConstant(m, "POOL_MALLOC", AC_POOL_MALLOC) < 0 ||
        PyModule_AddStringConstant(m, "POOL_FREE", AC_POOL_FREE) < 0 ||
        PyModule_AddObjectRef(m, "AllocConfError", st->error_type) < 0 ||
        PyModule_AddObjectRef(m, "AllocConfWarning", st->warning_type) < 0) {
        return -1;
    }
    return register_at_fork(m, st);
}

static int
module_traverse(PyObject *m, visitproc visit, void *arg)
{
    ac_state *st = get_state(m);
    return st == NULL ? 0 : ac_state_traverse(st, visit, arg);
}

static int
module_clear(PyObject *m)
{
    ac_state *st = get_state(m);
    if (st != NULL) {
        ac_state_clear(st);
    }
    return 0;
}

static void
module_free(void *m)
{
    ac_state *st = get_state((PyObject *)m);
    if (st != NULL) {
        ac_state_free(st);
    }
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
