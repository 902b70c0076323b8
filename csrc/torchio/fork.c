/*
 * fork.c -- the at-fork child handler (registered at module exec with
 * os.register_at_fork): a child has only the thread that forked, so it
 * gets a free lock and keeps only that thread's windows; torch, copied
 * with the process, is written only where the fork dropped something it
 * must be brought back from, so that a DataLoader worker holds what its
 * parent holds without a setter call of its own.
 */
#include "torchio/torch.h"

#include <stdlib.h>
#include <unistd.h>

void
ac_after_fork_child(ac_state *st)
{
    unsigned long me = PyThread_get_thread_ident();
    pid_t pid = getpid();
    Py_ssize_t off = 0, on = 0;
    size_t i, kept = 0;
    int mine, other, dropped;

    if (pid == st->pid) {
        return; /* called in the process that forked, not in a child */
    }
    st->pid = pid;
    mine = st->owner == me;
    other = st->owner != 0 && !mine;
    /* Another thread may have held the lock, or been between taking it
     * and recording itself (it had changed nothing yet then): that thread
     * does not exist here. */
    if (!mine && ac_lock_renew(st) < 0) {
        return; /* no memory: the next call reports it */
    }
    if (other && st->attached) {
        /* It may have been half-way through a write: what torch holds is
         * not known, so the write below names every sticky key. */
        Py_CLEAR(st->in_force);
        st->mask_in_force = 0;
    }
    for (i = 0; i < st->n_pools; i++) {
        st->pool_slots[i].busy = 0;
    }
    for (i = 0; i < st->n_openers; i++) {
        if (st->openers[i].thread == me) {
            size_t r;
            st->openers[kept] = st->openers[i];
            off = st->openers[kept].off;
            on = st->openers[kept].on;
            for (r = 0; r < st->openers[kept].n_routes; r++) {
                st->pool_slots[st->openers[kept].routes[r]].busy = 1;
            }
            kept++;
        }
        else {
            free(st->openers[i].routes); /* the pools are free again */
        }
    }
    st->n_openers = kept;
    dropped = off != st->n_off || on != st->n_on;
    st->n_off = off;
    st->n_on = on;
    /* This thread inside a write finishes it; with nothing dropped, torch
     * holds what the windows here want. */
    if (mine || (!other && !dropped)) {
        return;
    }
    st->owner = me;
    if (ac_sync_locked(st, "after fork() wrote") < 0) {
        ac_trace_locked(st, "after fork(): torch refused the write", NULL);
        PyErr_Clear(); /* an at-fork handler has nobody to raise to */
    }
    st->owner = 0;
}
