/*
 * neighbours.h -- the default stepping back for neighbours, and writes
 * by other components through torch's setter, kept (see neighbours.c).
 */
#ifndef ALLOCCONF_NEIGHBOURS_H
#define ALLOCCONF_NEIGHBOURS_H

#include "state.h"

/* Record that the neighbour `name` (a str) is in the process, `why` (a
 * str) saying what expandable segments do to it.  allocconf's default
 * steps back (expandable segments off, written at once when torch is
 * attached) unless the user, another component or ALLOCCONF_STEP_BACK=0
 * decided otherwise.  Returns True when it stepped back now, False
 * otherwise, NULL with an exception set (nothing changed). */
PyObject *ac_neighbour(ac_state *st, PyObject *name, PyObject *why);

/* Another component called torch's setter with `s`: merge the keys it
 * names into the configuration and write the whole, open windows still
 * holding, `writer` (a str) naming who in status().  Returns None;
 * NotImplemented when allocconf writes nothing here (torch not attached,
 * or a configuration allocconf leaves alone) and the caller must call
 * torch itself; NULL with torch's own exception when torch refused. */
PyObject *ac_foreign_write(ac_state *st, PyObject *writer, PyObject *s);

#endif /* ALLOCCONF_NEIGHBOURS_H */
