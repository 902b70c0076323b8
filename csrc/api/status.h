/*
 * status.h -- allocconf.status(): what allocconf did and why.
 */
#ifndef ALLOCCONF_STATUS_H
#define ALLOCCONF_STATUS_H

#include "state/state.h"

/* A new dict with the fields of allocconf.Status (AC_STATUS_FIELDS),
 * or NULL with an exception set. */
PyObject *ac_status(ac_state *st);

/* The switches (auto, step_back, keep_foreign, export) and the strings
 * child_env() needs (base: what torch holds outside windows, None where
 * allocconf writes nothing; user; source), and the counts of foreign
 * writes kept and of writes found by reading torch back: a new dict. */
PyObject *ac_internals(ac_state *st);

/* With ALLOCCONF_EXPORT=1 and torch attached, what ac_internals() says
 * as base (a new str); else None.  Cheap: called after every write. */
PyObject *ac_export_base(ac_state *st);

#endif /* ALLOCCONF_STATUS_H */
