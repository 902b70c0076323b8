/*
 * overrides.h -- keyword overrides (configure(**kw), merge(base, **kw))
 * turned into a patch of canonical text, before any lock is taken.
 */
#ifndef ALLOCCONF_OVERRIDES_H
#define ALLOCCONF_OVERRIDES_H

#include "state/state.h"

/* Turn the dict `kwargs` (may be NULL) into *patch (empty on entry): each
 * key with its value as canonical text, checked against the key's rule,
 * or NULL for None (remove).  Runs the values' __str__, so it must be
 * called without the state lock.  0, or -1 with an exception set (the
 * patch left empty). */
int ac_overrides_patch(ac_state *st, PyObject *kwargs, ac_conf *patch);

#endif /* ALLOCCONF_OVERRIDES_H */
