/*
 * writes.h -- the two run-time writers of the configuration: the user's
 * configure(), and other components calling torch's setter (through the
 * wrappers of allocconf/_neighbours.py).
 */
#ifndef ALLOCCONF_WRITES_H
#define ALLOCCONF_WRITES_H

#include "state/state.h"

/* Merge `conf` (a str, or NULL) and `patch` into the user's layer and
 * write the result.  The new configuration as a new str, or NULL with an
 * exception set and the state unchanged. */
PyObject *ac_configure(ac_state *st, PyObject *conf, const ac_conf *patch);

/* Another component called torch's setter with `s`: it replaces the
 * previous such write, on the user's layer, open windows still holding;
 * `writer` (a str) names who in status().  Returns None; NotImplemented
 * when allocconf writes nothing here (torch not attached, or a
 * configuration allocconf leaves alone) and the caller must call torch
 * itself; NULL with torch's own exception when torch refused. */
PyObject *ac_foreign_write(ac_state *st, PyObject *writer, PyObject *s);

#endif /* ALLOCCONF_WRITES_H */
