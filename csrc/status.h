/*
 * status.h -- allocconf.status(): what allocconf did and why.
 */
#ifndef ALLOCCONF_STATUS_H
#define ALLOCCONF_STATUS_H

#include "state.h"

/* A new dict with the fields of allocconf.Status (AC_STATUS_FIELDS),
 * or NULL with an exception set. */
PyObject *ac_status(ac_state *st);

#endif /* ALLOCCONF_STATUS_H */
