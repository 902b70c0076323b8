/*
 * config.h -- the user's configuration and the strings written for it:
 * adopting a configuration, configure(), and the string torch should
 * hold now.
 */
#ifndef ALLOCCONF_CONFIG_H
#define ALLOCCONF_CONFIG_H

#include "overrides.h"
#include "state.h"

/* expandable_segments in c: 1, 0, or -1 when not set. */
int ac_conf_es(const ac_conf *c);

/* Make `parsed` (held by torch as `raw`) the user's configuration, from
 * `source`, with its strings built.  Lock held.  0, or -1 with an
 * exception set and nothing changed; `parsed` is consumed either way. */
int ac_adopt_user_locked(ac_state *st, ac_conf *parsed, PyObject *raw,
                         int auto_on, const char *source);

/* Build the strings for windows on what torch holds (in_force), after it
 * refused allocconf's: the user's configuration stays as the user gave
 * it.  Lock held.  0, or -1 with an exception set. */
int ac_fall_back_locked(ac_state *st);

/* The string torch should hold now (borrowed), and the sticky keys it
 * names. */
PyObject *ac_target_locked(ac_state *st, unsigned *mask);

/* The canonical string of c without `skip_key` entries (may be NULL),
 * checked by parsing it again (the rules between keys).  A new str, or
 * NULL with AllocConfError set, its offset into that string. */
PyObject *ac_checked_string(ac_state *st, const ac_conf *c,
                            const char *skip_key);

/* Merge `conf` (a str, or NULL) and `patch` into the user's configuration
 * and write it.  The new configuration as a new str, or NULL with an
 * exception set and the state unchanged. */
PyObject *ac_configure(ac_state *st, PyObject *conf, const ac_conf *patch);

#endif /* ALLOCCONF_CONFIG_H */
