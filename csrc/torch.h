/*
 * torch.h -- finding torch's setter and getter, writing through the
 * setter, reading back what torch holds, and attaching to torch when it
 * has been imported.  torch is never imported from here: the Python side
 * hands the module over once `import torch` has finished.
 */
#ifndef ALLOCCONF_TORCH_H
#define ALLOCCONF_TORCH_H

#include "state.h"

/* Bring torch to the target string if it holds another, naming the
 * sticky keys it would otherwise keep (facts §2).  Lock held.  Returns 0,
 * or -1 with torch's exception set, torch given back what it held. */
int ac_sync_locked(ac_state *st, const char *why);

/* Write the str `s` through torch's setter exactly as given (a string
 * allocconf cannot merge, written by another component) and take it as
 * what torch holds.  Lock held.  0, or -1 with torch's exception set. */
int ac_write_as_is_locked(ac_state *st, PyObject *s, const char *why);

/* The configuration string torch holds now, where it can tell without
 * initialising CUDA (the 2.13+ getter; the snapshot once CUDA is up).  A
 * new str, or NULL with no exception set when torch cannot tell.  Runs
 * torch's code: call it without the lock. */
PyObject *ac_read_live(PyObject *torch);

/* The variables the torch module reads (ac_env_reads) in *reads, and in
 * *generic whether it has the 2.10 setter; found as ac_attach finds them.
 * Runs torch's code: call it without the lock.  0, or -1 with an
 * exception set. */
int ac_torch_reads(PyObject *torch, unsigned *reads, int *generic);

/* Attach to the torch module: find the setter, read the live string,
 * write allocconf's configuration.  Returns a new list of warning texts,
 * or NULL with an exception set (nothing changed in that case). */
PyObject *ac_attach(ac_state *st, PyObject *torch);

#endif /* ALLOCCONF_TORCH_H */
