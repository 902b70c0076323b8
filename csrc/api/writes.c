/*
 * writes.c -- configure() and the writes of other components.  Each is
 * parsed before the lock, built as a change of the layers
 * (state/layers.c), and written by the torch layer, which puts the state
 * back if torch refuses.
 */
#include "api/writes.h"
#include "state/environ.h"
#include "state/errors.h"
#include "torchio/torch.h"

/* configure() with the lock held: *o says what stopped it when it
 * returns NULL without an exception. */
typedef struct {
    PyObject *refusal;   /* allocconf's reason, or NULL */
    PyObject *torch_exc; /* torch's exception, or NULL */
    PyObject *target;    /* the string torch refused, or NULL */
    int reentered;       /* the setter called back into allocconf */
} outcome;

static PyObject *
configure_locked(ac_state *st, const ac_conf *add, const ac_conf *patch,
                 PyObject *writer, outcome *o)
{
    ac_next n = AC_NEXT_INIT;
    PyObject *result = NULL;

    if (!st->loaded) {
        /* Only reached when _C is used without the package's __init__. */
        PyObject *ignored = PyList_New(0);
        int rc = ignored == NULL ? -1 : ac_load_locked(st, ignored);
        Py_XDECREF(ignored);
        if (rc < 0) {
            return NULL;
        }
    }
    if (st->block == AC_BLOCK_MALFORMED) {
        o->refusal = PyUnicode_FromFormat(
            "allocconf: %s is malformed (%V); fix it before configure() can "
            "merge into it",
            st->source, st->block_detail, "?");
        return NULL;
    }
    if (ac_next_configure(st, add, patch, &n, &o->refusal) < 0) {
        goto done;
    }
    if (ac_apply_locked(st, &n, "configure() wrote") < 0) {
        o->torch_exc = PyErr_GetRaisedException();
        o->target = Py_NewRef(ac_next_target(st, &n));
        o->reentered = st->reentered;
        goto done;
    }
    Py_XSETREF(st->writer, Py_NewRef(writer));
    st->configured = 1;
    /* What was written (or will be, once torch is imported); where
     * allocconf writes nothing, what torch holds. */
    result = Py_NewRef(st->attached && !ac_may_write(st) && st->in_force
                           ? st->in_force
                           : st->str_base);
done:
    ac_next_clear(&n);
    return result;
}

PyObject *
ac_configure(ac_state *st, PyObject *conf, const ac_conf *patch)
{
    ac_conf add = {NULL, 0, 0};
    outcome o = {NULL, NULL, NULL, 0};
    PyObject *result = NULL, *writer;
    ac_error err;

    /* The new text is parsed before the lock: nothing of the user's runs
     * under it. */
    if (conf != NULL) {
        const char *s;
        Py_ssize_t n;
        if (ac_conf_chars(conf, &s, &n) < 0) {
            return NULL;
        }
        if (ac_conf_parse(s, (size_t)n, &add, &err) < 0) {
            return ac_raise(st, &err, conf);
        }
    }
    writer = PyUnicode_FromString("allocconf.configure()");
    if (writer != NULL && ac_lock_read_back(st) == 0) {
        result = configure_locked(st, &add, patch, writer, &o);
        ac_unlock(st);
    }
    if (o.refusal != NULL) {
        ac_raise_plain(st, o.refusal, NULL);
    }
    if (o.target != NULL) {
        ac_raise_write_failed(st, o.target, o.torch_exc, o.reentered);
        Py_DECREF(o.target);
    }
    Py_XDECREF(writer);
    ac_conf_clear(&add);
    return result;
}

/* The layers after a write `s` (NULL: one allocconf cannot read, of which
 * it keeps nothing), swapped in; written when `write`.  Lock held.  0, or
 * -1 with an exception set (torch's, with the state as it was). */
static int
take_foreign_locked(ac_state *st, const ac_conf *s, int write)
{
    ac_conf none = {NULL, 0, 0};
    ac_next n = AC_NEXT_INIT;
    int rc = ac_next_foreign(st, s != NULL ? s : &none, &n);

    if (rc == 0 && write) {
        rc = ac_apply_locked(st, &n,
                             "kept a write by another component; "
                             "wrote");
    }
    else if (rc == 0) {
        ac_next_swap(st, &n);
    }
    ac_next_clear(&n);
    return rc;
}

PyObject *
ac_foreign_write(ac_state *st, PyObject *writer, PyObject *s)
{
    ac_conf parsed = {NULL, 0, 0};
    ac_error err;
    const char *u;
    Py_ssize_t n;
    PyObject *result = NULL;
    int readable, backend;

    if (!PyUnicode_CheckExact(writer) || !PyUnicode_CheckExact(s)) {
        Py_RETURN_NOTIMPLEMENTED; /* torch gives its own TypeError */
    }
    u = PyUnicode_AsUTF8AndSize(s, &n);
    if (u == NULL) {
        if (!ac_clear_ordinary()) {
            return NULL;
        }
        Py_RETURN_NOTIMPLEMENTED; /* a lone surrogate: torch's to refuse */
    }
    /* Parsed before the lock. */
    readable = ac_conf_parse(u, (size_t)n, &parsed, &err) == 0;
    if (!readable && err.nomem) {
        return PyErr_NoMemory();
    }
    backend = readable && ac_conf_get(&parsed, "backend") != NULL;
    if (ac_lock_read_back(st) < 0) {
        ac_conf_clear(&parsed);
        return NULL;
    }
    if (!st->attached || !ac_may_write(st) || st->setter == NULL) {
        /* allocconf writes nothing here: the caller calls torch itself. */
        result = Py_NewRef(Py_NotImplemented);
    }
    else {
        /* A string allocconf cannot read (a NUL, a separator torch
         * misreads), or one naming backend (read once, at load): torch
         * judges it as given, then the layers take what they can. */
        int rc = readable && !backend
                     ? 0
                     : ac_write_as_is_locked(
                           st, s, "a write by another component, as given:");
        if (rc == 0) {
            rc = take_foreign_locked(st, readable ? &parsed : NULL, readable);
        }
        if (rc == 0) {
            Py_XSETREF(st->writer, Py_NewRef(writer));
            st->foreign_n++;
            result = Py_NewRef(Py_None);
        }
    }
    ac_unlock(st);
    ac_conf_clear(&parsed);
    return result;
}
