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

/* What stopped a merge, when it did not come back: allocconf's reason
 * (refusal), or torch's exception and the string it refused. */
typedef struct {
    PyObject *refusal;   /* str, or NULL */
    PyObject *torch_exc; /* torch's exception, or NULL */
    PyObject *target;    /* the string torch refused, or NULL */
} ac_outcome;

/* Merge `add` and `patch` (each may be NULL) into the user's
 * configuration, commit, and write it, naming `writer` (a str) in
 * status().  `foreign`: a write by another component, which allocconf
 * never refuses.  Lock held.  The new configuration as a new str; or NULL
 * with an exception set, or with o->refusal, or with o->torch_exc and
 * o->target set; the state is unchanged then. */
PyObject *ac_merge_write_locked(ac_state *st, const ac_conf *add,
                                const ac_conf *patch, PyObject *writer,
                                int foreign, ac_outcome *o);

/* Build the strings again from the user's configuration (after the
 * default changed).  Lock held.  0, or -1 with an exception set. */
int ac_rebuild_locked(ac_state *st);

/* Merge `conf` (a str, or NULL) and `patch` into the user's configuration
 * and write it.  The new configuration as a new str, or NULL with an
 * exception set and the state unchanged. */
PyObject *ac_configure(ac_state *st, PyObject *conf, const ac_conf *patch);

#endif /* ALLOCCONF_CONFIG_H */
