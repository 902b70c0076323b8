/*
 * window.c -- windows: while one is open anywhere in the process, torch
 * holds expandable segments as it says (off wins over on), and the
 * configuration from before comes back when the last one closes.
 *
 * The counts are kept per thread as well as in total, so that a child
 * forked inside another thread's window drops that window (state.c); a
 * window closed by another thread than the one that opened it (an async
 * task moved between threads) is taken off whichever thread has one.
 */
#include "api/window.h"
#include "state/errors.h"
#include "torchio/torch.h"

#include <stdlib.h>

/* ------------------------------------------------------------------ */
/* Counting                                                             */
/* ------------------------------------------------------------------ */

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
    o = enter ? ac_opener_of(st, me) : closer_of(st, me, enabled);
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
    ac_opener_tidy(st, o);
    ac_unlock(st);
    if (exc != NULL) {
        ac_raise_write_failed(st, target, exc, reentered);
        Py_DECREF(target);
        return -1;
    }
    return 0;
}
