/*
 * layers.h -- the configuration as layers, and the strings written for
 * it: the pure transitions of the state (what torch should hold after
 * each change), computed without calling torch.  The torch layer
 * (torchio/) writes what these decide.
 *
 * The rule (docs/design.md, "Whose keys win"): the user's configuration
 * is the floor; each write by another component replaces the previous
 * one, as in torch, keys it names taking its values and keys it leaves
 * out going back to the user's value (or torch's default), sticky keys
 * staying as torch keeps them; allocconf's default and the windows set
 * expandable_segments on top.
 */
#ifndef ALLOCCONF_LAYERS_H
#define ALLOCCONF_LAYERS_H

#include "state/state.h"

/* expandable_segments in c: 1, 0, or -1 when not set. */
int ac_conf_es(const ac_conf *c);

/* expandable_segments as the layers give it, before allocconf's default:
 * 1, 0, or -1 when neither the user nor another component set it. */
int ac_layers_es(const ac_state *st);

/* The sticky keys whose default can be written back to this torch. */
unsigned ac_restorable(const ac_state *st);

/* The sticky keys of the str `s` (ac_sticky_mask); when it does not
 * parse, every key with a default counts as off it. */
unsigned ac_sticky_mask_str(const ac_state *st, PyObject *s);

/* Make `parsed` (held by torch as `raw`) the user's configuration, from
 * `source`, with its strings built.  Lock held.  0, or -1 with an
 * exception set and nothing changed; `parsed` is consumed either way. */
int ac_adopt_user_locked(ac_state *st, ac_conf *parsed, PyObject *raw,
                         int auto_on, const char *source);

/* Build the strings again from the layers (after the default changed).
 * Lock held.  0, or -1 with an exception set. */
int ac_rebuild_locked(ac_state *st);

/* The string torch should hold now (borrowed), and the sticky keys it
 * names. */
PyObject *ac_target_locked(ac_state *st, unsigned *mask);

/* The canonical string of c without `skip_key` entries (may be NULL),
 * checked by parsing it again (the rules between keys).  A new str, or
 * NULL with AllocConfError set, its offset into that string. */
PyObject *ac_checked_string(ac_state *st, const ac_conf *c,
                            const char *skip_key);

/* ------------------------------------------------------------------ */
/* Changes to come: built from the state, then swapped in (ac_next_swap)
 * for the torch layer to write, and swapped out again if torch refuses.
 * Each builder fills an empty ac_next (AC_NEXT_INIT) and returns 0, or
 * -1 with an exception set; ac_next_clear frees it either way. */

typedef struct {
    ac_conf user;
    ac_conf foreign;
    int whole;
    PyObject *user_raw;
    PyObject *base, *on, *off;
    int base_es;
    unsigned mask_base, mask_on, mask_off;
} ac_next;

#define AC_NEXT_INIT                                                          \
    {                                                                         \
        {NULL, 0, 0}, {NULL, 0, 0}, 0, NULL, NULL, NULL, NULL, -1, 0, 0, 0    \
    }

void ac_next_clear(ac_next *n);

/* configure(): `add` and `patch` (each may be NULL) merged into the
 * user's layer; the keys they name leave the other components' layer
 * (the newer choice wins), and the user's layer applies again.  When
 * allocconf will not make that change (a new backend, a sticky key torch
 * cannot be given back), -1 with *refusal a new str saying why and no
 * exception set. */
int ac_next_configure(ac_state *st, const ac_conf *add, const ac_conf *patch,
                      ac_next *n, PyObject **refusal);

/* A write `s` by another component: it replaces the previous one, the
 * sticky keys that one set and `s` leaves out staying. */
int ac_next_foreign(ac_state *st, const ac_conf *s, ac_next *n);

/* torch holds `held` (NULL: a string allocconf cannot read), written by
 * someone allocconf did not see: taken as a write by another component;
 * with ALLOCCONF_KEEP_FOREIGN=0 as all torch holds (`whole`), as torch
 * alone would have it. */
int ac_next_unseen(ac_state *st, const ac_conf *held, ac_next *n);

/* torch refused allocconf's configuration at attach and holds `held`:
 * windows build on that alone, with no default of allocconf's. */
int ac_next_fall_back(ac_state *st, const ac_conf *held, ac_next *n);

/* The string n would have torch hold with the windows open now
 * (borrowed): what ac_target_locked will say once n is swapped in. */
PyObject *ac_next_target(const ac_state *st, const ac_next *n);

/* Exchange the state's layers and strings with n's. */
void ac_next_swap(ac_state *st, ac_next *n);

#endif /* ALLOCCONF_LAYERS_H */
