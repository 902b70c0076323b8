/*
 * scoped.h -- ipc_safe() windows of the opener's scope: the thread that
 * opens one has its allocations routed to allocconf's pools of classic
 * memory while it is open; nothing process-wide changes.
 */
#ifndef ALLOCCONF_SCOPED_H
#define ALLOCCONF_SCOPED_H

#include "state/state.h"

/* Open (enter=1) or close (enter=0) a window of the opener's scope.
 * Where it cannot route (no pools, CUDA not up yet) it holds expandable
 * segments off process-wide instead, as ac_window(st, 0, ...) does.
 * Returns 0, or -1 with an exception set and nothing changed. */
int ac_scoped_window(ac_state *st, int enter);

/* Take torch's pool routing (the tuple allocconf._pools.probe builds)
 * or, with `api` None, the str `why` windows hold process-wide.  0, or
 * -1 with an exception set. */
int ac_set_pools(ac_state *st, PyObject *api, PyObject *why);

/* Let go of every pool, so that torch gives what they hold back to the
 * device (free blocks at once, blocks in use once freed and emptied by
 * torch.cuda.empty_cache()).  The next window makes new ones.  0, or -1
 * with RuntimeError set (a window routes now) and nothing changed. */
int ac_release_pools(ac_state *st);

/* With the lock: the scope windows take now ("opener" or "process") and
 * why, as new strs; NULL with an exception set. */
PyObject *ac_scope_locked(const ac_state *st);
PyObject *ac_scope_reason_locked(const ac_state *st);

/* With the lock: the windows of the opener's scope open in all threads
 * that route (those held process-wide count in st->n_off). */
Py_ssize_t ac_routed_locked(const ac_state *st);

#endif /* ALLOCCONF_SCOPED_H */
