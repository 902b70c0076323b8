/*
 * neighbours.h -- the default stepping back for neighbours (see
 * neighbours.c).
 */
#ifndef ALLOCCONF_NEIGHBOURS_H
#define ALLOCCONF_NEIGHBOURS_H

#include "state/state.h"

/* Record that the neighbour `name` (a str) is in the process, `why` (a
 * str) saying what expandable segments do to it.  allocconf's default
 * steps back (expandable segments off, written at once when torch is
 * attached) unless the user, another component or ALLOCCONF_STEP_BACK=0
 * decided otherwise.  Returns True when it stepped back now, False
 * otherwise, NULL with an exception set (nothing changed). */
PyObject *ac_neighbour(ac_state *st, PyObject *name, PyObject *why);

#endif /* ALLOCCONF_NEIGHBOURS_H */
