/*
 * status.h -- allocconf.status(): what allocconf did and why.
 */
#ifndef ALLOCCONF_STATUS_H
#define ALLOCCONF_STATUS_H

#include "state.h"

/* A new dict with the fields of allocconf.Status (AC_STATUS_FIELDS),
 * or NULL with an exception set. */
PyObject *ac_status(ac_state *st);

/* The switches (auto, step_back, keep_foreign, export) and the strings
 * child_env() and the export need (base: what torch holds outside
 * windows, None where allocconf writes nothing; user; source), and the
 * count of foreign writes kept: a new dict. */
PyObject *ac_internals(ac_state *st);

#endif /* ALLOCCONF_STATUS_H */
