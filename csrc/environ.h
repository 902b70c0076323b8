/*
 * environ.h -- reading the variables torch reads (PYTORCH_*_ALLOC_CONF)
 * and allocconf's own (ALLOCCONF_AUTO, ALLOCCONF_DEBUG).
 */
#ifndef ALLOCCONF_ENVIRON_H
#define ALLOCCONF_ENVIRON_H

#include "state.h"

/* A new tuple of the variables allocconf reads (bytes, None where unset),
 * to notice a change made before torch was imported. */
PyObject *ac_env_snapshot(void);

/* Read the environment into the state, lock held.  0, or -1 with an
 * exception set; problems with the user's strings become warning texts
 * in the list `warnings`, never exceptions. */
int ac_load_locked(ac_state *st, PyObject *warnings);

/* ac_load_locked under the lock: a new list of warning texts, or NULL. */
PyObject *ac_load_environ(ac_state *st);

#endif /* ALLOCCONF_ENVIRON_H */
