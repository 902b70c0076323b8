/*
 * state.c -- the module state's life cycle, its lock and tracing.
 *
 * torch's allocator is one per process, so allocconf keeps one state per
 * process: `claimed` below points at it while it lives, and a second
 * module exec (the module deleted from sys.modules and imported again, or
 * a sub-interpreter on Python 3.9-3.11) is refused with ImportError.  That
 * pointer is the only static mutable datum in the extension; it is read
 * and written with the GIL held, at module exec and free.
 */
#include "state/state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ac_state *claimed;

/* ------------------------------------------------------------------ */
/* Life cycle                                                           */
/* ------------------------------------------------------------------ */

static int
lock_alloc(ac_state *st)
{
#if PY_VERSION_HEX >= 0x030D0000
    memset(&st->mutex, 0, sizeof(st->mutex));
#else
    st->mutex = PyThread_allocate_lock();
    if (st->mutex == NULL) {
        PyErr_NoMemory();
        return -1;
    }
#endif
    st->owner = 0;
    return 0;
}

int
ac_state_init(ac_state *st)
{
#define AC_NAME_FIELD(name, text) text,
    static const char *const names[AC_NKEYS] = {
        AC_STATUS_FIELDS(AC_NAME_FIELD)};
#undef AC_NAME_FIELD
    size_t i;

    int64_t interp = PyInterpreterState_GetID(PyInterpreterState_Get());

    if (interp < 0) {
        return -1;
    }
    if (claimed != NULL && claimed->interp != interp) {
        /* `interp` of the claimed state is written once, at its init. */
        PyErr_Format(
            PyExc_ImportError,
            "allocconf: already imported by another interpreter of this "
            "process (interpreter %lld; this is interpreter %lld); torch's "
            "allocator is one per process, so allocconf keeps one state, "
            "in the interpreter that imported it first. Import allocconf "
            "in one interpreter only (the main one, before any "
            "sub-interpreter does)",
            (long long)claimed->interp, (long long)interp);
        return -1;
    }
    if (claimed != NULL) {
        PyErr_SetString(
            PyExc_ImportError,
            "allocconf: allocconf._C is already loaded in this process "
            "(imported again after being removed from sys.modules); "
            "torch's allocator is one per process, so allocconf keeps one "
            "state: use the module already loaded");
        return -1;
    }
    if (lock_alloc(st) < 0) {
        return -1;
    }
    for (i = 0; i < AC_NKEYS; i++) {
        st->status_keys[i] = PyUnicode_InternFromString(names[i]);
        if (st->status_keys[i] == NULL) {
            return -1;
        }
    }
    st->neighbours = PyDict_New();
    if (st->neighbours == NULL) {
        return -1;
    }
    st->auto_on = 1;
    st->step_back = 1;
    st->keep_foreign = 1;
    st->base_es = -1;
    st->pid = getpid();
    st->interp = interp;
    claimed = st;
    return 0;
}

int
ac_state_traverse(ac_state *st, visitproc visit, void *arg)
{
    size_t i;
#define AC_VISIT_FIELD(name) Py_VISIT(st->name);
    AC_OWNED_FIELDS(AC_VISIT_FIELD)
#undef AC_VISIT_FIELD
    for (i = 0; i < AC_NKEYS; i++) {
        Py_VISIT(st->status_keys[i]);
    }
    return 0;
}

void
ac_state_clear(ac_state *st)
{
    size_t i;
#define AC_CLEAR_FIELD(name) Py_CLEAR(st->name);
    AC_OWNED_FIELDS(AC_CLEAR_FIELD)
#undef AC_CLEAR_FIELD
    for (i = 0; i < AC_NKEYS; i++) {
        Py_CLEAR(st->status_keys[i]);
    }
}

void
ac_state_free(ac_state *st)
{
    size_t i;

    ac_state_clear(st);
    ac_conf_clear(&st->user);
    ac_conf_clear(&st->foreign);
    for (i = 0; i < st->n_openers; i++) {
        free(st->openers[i].routes);
    }
    free(st->openers);
    st->openers = NULL;
    st->n_openers = st->cap_openers = 0;
    free(st->pool_slots);
    st->pool_slots = NULL;
    st->n_pools = st->cap_pools = 0;
#if PY_VERSION_HEX < 0x030D0000
    if (st->mutex != NULL) {
        PyThread_free_lock(st->mutex);
        st->mutex = NULL;
    }
#endif
    if (claimed == st) {
        claimed = NULL;
    }
}

/* ------------------------------------------------------------------ */
/* Lock                                                                 */
/* ------------------------------------------------------------------ */

int
ac_lock(ac_state *st)
{
    unsigned long me = PyThread_get_thread_ident();

    /* `owner` is written only by the thread holding the lock, and read
     * here with the GIL held, so equality with our own ident is exact. */
    if (st->owner == me) {
        /* This thread holds the lock: writing the field is safe. */
        st->reentered = 1;
        PyErr_SetString(PyExc_RuntimeError,
                        "allocconf: called from inside torch's allocator "
                        "setter while allocconf was writing through it; call "
                        "allocconf after the setter returns");
        return -1;
    }
#if PY_VERSION_HEX >= 0x030D0000
    PyMutex_Lock(&st->mutex); /* detaches from the GIL while it waits */
#else
    if (!PyThread_acquire_lock(st->mutex, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
            PyThread_acquire_lock(st->mutex, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
#endif
    st->owner = me;
    return 0;
}

int
ac_lock_renew(ac_state *st)
{
#if PY_VERSION_HEX < 0x030D0000
    /* The old lock may be held by a thread that does not exist here;
     * nobody can wait on it in a child that has one thread. */
    if (st->mutex != NULL) {
        PyThread_free_lock(st->mutex);
        st->mutex = NULL;
    }
#endif
    if (lock_alloc(st) < 0) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

void
ac_unlock(ac_state *st)
{
    st->owner = 0;
#if PY_VERSION_HEX >= 0x030D0000
    PyMutex_Unlock(&st->mutex);
#else
    PyThread_release_lock(st->mutex);
#endif
}

PyObject *
ac_with_warnings(ac_state *st, ac_locked_fn fn, void *arg)
{
    PyObject *warnings = PyList_New(0);
    int rc;

    if (warnings == NULL || ac_lock(st) < 0) {
        Py_XDECREF(warnings);
        return NULL;
    }
    rc = fn(st, arg, warnings);
    ac_unlock(st);
    if (rc < 0) {
        Py_DECREF(warnings);
        return NULL;
    }
    return warnings;
}

/* ------------------------------------------------------------------ */
/* Trace                                                                */
/* ------------------------------------------------------------------ */

void
ac_trace_locked(ac_state *st, const char *what, PyObject *s)
{
    if (!st->debug) {
        return;
    }
    if (s != NULL) {
        const char *u = PyUnicode_AsUTF8(s);
        if (u == NULL) {
            PyErr_Clear();
            u = "?";
        }
        fprintf(stderr, "allocconf: %s '%s'\n", what, u);
    }
    else {
        fprintf(stderr, "allocconf: %s\n", what);
    }
    fflush(stderr);
}

void
ac_trace(ac_state *st, const char *msg)
{
    if (ac_lock(st) < 0) {
        PyErr_Clear();
        return;
    }
    ac_trace_locked(st, msg, NULL);
    ac_unlock(st);
}

/* ------------------------------------------------------------------ */
/* The windows of each thread                                           */
/* ------------------------------------------------------------------ */

ac_opener *
ac_opener_of(ac_state *st, unsigned long me)
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
    st->openers[st->n_openers] = (ac_opener){me, 0, 0, 0, 0, NULL, 0};
    return &st->openers[st->n_openers++];
}

void
ac_opener_tidy(ac_state *st, ac_opener *o)
{
    if (o->off == 0 && o->on == 0 && o->routed == 0 && o->held == 0) {
        free(o->routes);
        *o = st->openers[--st->n_openers];
    }
}
