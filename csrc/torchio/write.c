/*
 * write.c -- the writes through torch's setter, and reading back what
 * torch holds.
 *
 * A write happens only when the string torch should hold differs from
 * the one it holds, always under the lock, so the order of writes is the
 * order of the changes that caused them.  torch keeps the sticky keys a
 * write leaves out (docs/design.md, "What torch does with a write"), so
 * every write names those torch holds at another value than its default;
 * and when torch refuses a string it keeps part of it, so it is handed
 * back the string it held.
 */
#include "state/errors.h"
#include "torchio/torch.h"

#include <stdlib.h>

/* A new str: "k:default,..." for the sticky keys in `bits` that have a
 * default, then `s`.  NULL on error. */
static PyObject *
with_defaults(PyObject *s, unsigned bits)
{
    PyObject *r = Py_NewRef(s);
    int i;

    for (i = AC_NSTICKY - 1; i >= 0 && r != NULL; i--) {
        const char *d = ac_sticky_default(i);
        if ((bits & (1u << i)) && d != NULL) {
            Py_SETREF(r, PyUnicode_FromFormat(
                             "%s:%s%s%U", ac_sticky_key(i), d,
                             PyUnicode_GET_LENGTH(r) ? "," : "", r));
        }
    }
    return r;
}

/* The sticky keys torch holds after a write of a string whose mask is
 * `written`, when it held `before`: the keys the string names as it
 * says, the others as they were. */
static unsigned
held_after(unsigned before, unsigned written)
{
    unsigned kept = AC_STICKY_OFF(before) & ~AC_STICKY_NAMED(written);
    return written | (kept << AC_NSTICKY);
}

/* Call torch's setter with `s`.  0, or -1 with its exception set.
 *
 * seq moves on before the call and again after it: a read-back whose
 * getter call overlapped this one (the setter is Python code, so the GIL
 * can pass to the reading thread while it runs, before torch holds `s`)
 * sees another seq under the lock and does not count. */
static int
call_setter(ac_state *st, PyObject *s)
{
    PyObject *r;

    st->seq++;
    st->reentered = 0;
    r = PyObject_CallOneArg(st->setter, s);
    st->seq++;
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* After torch refused a write naming the sticky keys `named`: torch
 * parses in stages and keeps what it read before refusing, so hand it
 * back the string it held, with the defaults of the sticky keys the
 * refused write named and that string does not.  Keeps torch's first
 * exception set, unless giving back raised one that must propagate
 * (KeyboardInterrupt). */
static void
give_back(ac_state *st, unsigned named)
{
    PyObject *exc, *back;
    unsigned extra;

    if (st->in_force == NULL) {
        return;
    }
    exc = PyErr_GetRaisedException();
    extra = named & ~AC_STICKY_NAMED(st->mask_in_force);
    back = with_defaults(st->in_force, extra);
    if (back != NULL && call_setter(st, back) == 0) {
        Py_SETREF(st->in_force, back);
        st->mask_in_force =
            (st->mask_in_force | extra) & ~(extra << AC_NSTICKY);
    }
    else {
        Py_XDECREF(back);
        if (!ac_clear_ordinary()) {
            Py_SETREF(exc, PyErr_GetRaisedException());
        }
    }
    PyErr_SetRaisedException(exc);
}

int
ac_sync_locked(ac_state *st, const char *why)
{
    unsigned mask, named;
    PyObject *target = ac_target_locked(st, &mask), *write;

    if (!st->attached || !ac_may_write(st) || st->setter == NULL ||
        target == NULL) {
        return 0;
    }
    /* Sticky keys torch holds that the target leaves out get their
     * default, or torch would keep them; all of them when what torch
     * holds is not known. */
    named = (st->in_force == NULL ? ac_restorable(st)
                                  : AC_STICKY_OFF(st->mask_in_force)) &
            ~AC_STICKY_NAMED(mask);
    if (named == 0 && target == st->in_force) {
        return 0;
    }
    write = with_defaults(target, named);
    if (write == NULL) {
        return -1;
    }
    /* Both exact str: the comparison runs no Python code. */
    if (st->in_force != NULL && PyUnicode_Compare(write, st->in_force) == 0) {
        Py_DECREF(write);
        return 0;
    }
    if (call_setter(st, write) < 0) {
        give_back(st, named | AC_STICKY_NAMED(mask));
        Py_DECREF(write);
        return -1;
    }
    Py_XSETREF(st->in_force, write);
    st->mask_in_force = mask | named;
    st->writes++;
    ac_trace_locked(st, why, write);
    return 0;
}

int
ac_apply_locked(ac_state *st, ac_next *n, const char *why)
{
    ac_next_swap(st, n);
    if (ac_sync_locked(st, why) < 0) {
        ac_next_swap(st, n);
        return -1;
    }
    return 0;
}

int
ac_write_as_is_locked(ac_state *st, PyObject *s, const char *why)
{
    unsigned mask = ac_sticky_mask_str(st, s);

    if (call_setter(st, s) < 0) {
        give_back(st, AC_STICKY_NAMED(mask));
        return -1;
    }
    Py_XSETREF(st->in_force, Py_NewRef(s));
    st->mask_in_force = held_after(st->mask_in_force, mask);
    ac_trace_locked(st, why, s);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Reading back                                                         */
/* ------------------------------------------------------------------ */

int
ac_read_back(ac_state *st, ac_reading *r)
{
    PyObject *get, *held;

    /* Read without the lock, with the GIL held (the module keeps the
     * GIL, Py_mod_gil): getter is set once, at attach; seq is checked
     * again under the lock before the reading counts. */
    r->held = NULL;
    get = Py_XNewRef(st->getter);
    r->seq = st->seq;
    if (get == NULL) {
        return 0;
    }
    held = PyObject_CallNoArgs(get);
    Py_DECREF(get);
    if (held == NULL) {
        return ac_clear_ordinary() ? 0 : -1;
    }
    if (PyUnicode_Check(held)) {
        /* An exact str (a copy of a subclass): compared under the lock. */
        r->held = PyUnicode_FromObject(held);
    }
    Py_DECREF(held);
    return r->held == NULL && PyErr_Occurred() ? -1 : 0;
}

int
ac_take_reading_locked(ac_state *st, const ac_reading *r)
{
    ac_next n = AC_NEXT_INIT;
    ac_conf held = {NULL, 0, 0};
    ac_error err;
    const char *s;
    Py_ssize_t len;
    int readable, rc;
    PyObject *writer;

    if (r->held == NULL || r->seq != st->seq || st->in_force == NULL ||
        !st->attached || !ac_may_write(st) ||
        PyUnicode_Compare(r->held, st->in_force) == 0) {
        return 0;
    }
    if (ac_conf_chars(r->held, &s, &len) < 0) {
        return -1;
    }
    readable = ac_conf_parse(s, (size_t)len, &held, &err) == 0;
    if (!readable && err.nomem) {
        PyErr_NoMemory();
        return -1;
    }
    writer = PyUnicode_FromString(
        "a write to torch's setter that allocconf did not see (read back "
        "from torch)");
    rc = writer == NULL ? -1 : ac_next_unseen(st, readable ? &held : NULL, &n);
    ac_conf_clear(&held);
    if (rc == 0) {
        ac_next_swap(st, &n);
        st->mask_in_force =
            held_after(st->mask_in_force, ac_sticky_mask_str(st, r->held));
        Py_SETREF(st->in_force, Py_NewRef(r->held));
        Py_XSETREF(st->writer, writer);
        writer = NULL;
        st->unseen++;
        ac_trace_locked(st,
                        "read back a write allocconf did not see:", r->held);
    }
    Py_XDECREF(writer);
    ac_next_clear(&n);
    return rc;
}

void
ac_reading_clear(ac_reading *r)
{
    Py_CLEAR(r->held);
}

int
ac_lock_read_back(ac_state *st)
{
    ac_reading r = AC_READING_INIT;
    int rc = ac_read_back(st, &r);

    if (rc == 0 && ac_lock(st) == 0) {
        rc = ac_take_reading_locked(st, &r);
        if (rc < 0) {
            ac_unlock(st);
        }
    }
    else {
        rc = -1;
    }
    ac_reading_clear(&r);
    return rc;
}
