/*
 * torch.h -- the third layer of csrc/ (docs/design.md, "Layers"):
 * everything allocconf asks of torch and writes to it.  write.c writes
 * through the setter and reads back what torch holds; attach.c looks
 * torch over and attaches to it; fork.c brings torch back in a child.
 * torch is never imported from here: the Python side hands the module
 * over once `import torch` has finished.
 */
#ifndef ALLOCCONF_TORCH_H
#define ALLOCCONF_TORCH_H

#include "state/layers.h"

/* ------------------------------------------------------------------ */
/* Writing (write.c)                                                    */
/* ------------------------------------------------------------------ */

/* Bring torch to the target string if it holds another, naming the
 * sticky keys it would otherwise keep.  Lock held.  Returns 0, or -1
 * with torch's exception set, torch given back what it held. */
int ac_sync_locked(ac_state *st, const char *why);

/* Swap the change `n` into the state and write it; when torch refuses,
 * swap it out again (the state as it was, torch's exception set, -1).
 * On success n holds what the state held: the caller clears it.  Lock
 * held. */
int ac_apply_locked(ac_state *st, ac_next *n, const char *why);

/* Write the str `s` through torch's setter exactly as given (a string
 * allocconf cannot merge, written by another component) and take it as
 * what torch holds.  Lock held.  0, or -1 with torch's exception set. */
int ac_write_as_is_locked(ac_state *st, PyObject *s, const char *why);

/* ------------------------------------------------------------------ */
/* Reading back what torch holds (write.c)                              */
/* ------------------------------------------------------------------ */

/* What torch's getter said, and when. */
typedef struct {
    PyObject *held; /* exact str, or NULL: no getter, or it failed */
    Py_ssize_t seq; /* st->seq when it was asked */
} ac_reading;

#define AC_READING_INIT                                                       \
    {                                                                         \
        NULL, 0                                                               \
    }

/* Ask torch's getter (2.13+) what it holds.  Runs torch's code: call it
 * without the lock.  0, or -1 with an exception set (KeyboardInterrupt,
 * MemoryError: the getter's ordinary errors count as no answer). */
int ac_read_back(ac_state *st, ac_reading *r);

/* With the lock: when torch holds another string than allocconf last
 * wrote and allocconf wrote nothing since `r` was read, someone wrote
 * past allocconf (a reference to torch's setter taken before allocconf
 * wrapped it, or ALLOCCONF_KEEP_FOREIGN=0): take that write into the
 * layers (ac_next_unseen), as what torch holds.  0, or -1 with an
 * exception set (no memory). */
int ac_take_reading_locked(ac_state *st, const ac_reading *r);

void ac_reading_clear(ac_reading *r);

/* Read back what torch holds, lock the state and take the reading: how
 * every call that acts on torch's state starts.  0 with the lock held,
 * or -1 with an exception set and the lock free. */
int ac_lock_read_back(ac_state *st);

/* ------------------------------------------------------------------ */
/* Looking torch over and attaching (attach.c)                          */
/* ------------------------------------------------------------------ */

/* The configuration string torch holds now, where it can tell without
 * initialising CUDA (the 2.13+ getter; the snapshot once CUDA is up).  A
 * new exact str; or NULL with no exception set when torch cannot tell,
 * or with one set for errors that must propagate (KeyboardInterrupt,
 * MemoryError).  Runs torch's code: call it without the lock. */
PyObject *ac_read_live(PyObject *torch);

/* The variables the torch module reads (ac_env_reads) in *reads, and in
 * *generic whether it has the 2.10 setter; found as ac_attach finds them.
 * Runs torch's code: call it without the lock.  0, or -1 with an
 * exception set. */
int ac_torch_reads(PyObject *torch, unsigned *reads, int *generic);

/* Attach to the torch module: find the setter and getter, read the live
 * string, write allocconf's configuration.  Returns a new list of
 * warning texts, or NULL with an exception set (nothing changed in that
 * case). */
PyObject *ac_attach(ac_state *st, PyObject *torch);

/* ------------------------------------------------------------------ */
/* allocconf's pools (pools.c)                                          */
/* ------------------------------------------------------------------ */

/* The calls into torch that route one thread's allocations to a pool,
 * through the tuple `api` (st->pool_api, a strong reference taken under
 * the lock).  Each runs torch's code: call it without the lock.  Each
 * returns 0 (or what it names), or -1 with torch's exception set. */

/* 1 when torch has initialised CUDA (routing needs it, and a window must
 * not start it), 0 when not. */
int ac_pools_cuda_up(PyObject *api);

/* The device torch's allocations go to now (torch.cuda.current_device
 * without its lazy init). */
int ac_pools_current_device(PyObject *api);

/* A new torch.cuda.MemPool of allocconf's on `device`, or NULL. */
PyObject *ac_pools_make(PyObject *api, int device);

/* Route the calling thread's allocations on `device` to the pool `id`
 * (begin), or stop (end, then let the pool's blocks be freed again). */
int ac_pools_begin(PyObject *api, int device, PyObject *id);
int ac_pools_end(PyObject *api, int device, PyObject *id);

/* ------------------------------------------------------------------ */
/* fork() (fork.c)                                                      */
/* ------------------------------------------------------------------ */

/* In a child just forked (and only there: the process that forked is
 * told apart by its pid): a free lock, only the windows of the thread
 * that forked, and a write only where the fork dropped something torch
 * must be brought back from.  Never raises. */
void ac_after_fork_child(ac_state *st);

#endif /* ALLOCCONF_TORCH_H */
