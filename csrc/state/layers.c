/*
 * layers.c -- the configuration in two layers (the user's, and the last
 * write by another component) and the three strings a write can carry:
 * the layers with expandable_segments as allocconf wants it (str_base),
 * forced on (str_on) and forced off (str_off).  They are built once per
 * change, so that a window only picks one.  Each change is built here as
 * an ac_next, without calling torch; the torch layer swaps it in, writes,
 * and swaps it out again if torch refuses (torchio/write.c).
 */
#include "state/layers.h"
#include "state/errors.h"

#include <stdlib.h>
#include <string.h>

int
ac_conf_es(const ac_conf *c)
{
    const char *v = ac_conf_get(c, "expandable_segments");
    if (v == NULL) {
        return -1;
    }
    return strcmp(v, "True") == 0;
}

int
ac_layers_es(const ac_state *st)
{
    int es = ac_conf_es(&st->foreign);
    if (es >= 0 || st->whole) {
        return es;
    }
    return ac_conf_es(&st->user);
}

unsigned
ac_restorable(const ac_state *st)
{
    unsigned mask = 0;
    int i;
    for (i = 0; i < AC_NSTICKY; i++) {
        if (ac_sticky_default(i) != NULL && (st->sticky_known & (1u << i))) {
            mask |= 1u << i;
        }
    }
    return mask;
}

unsigned
ac_sticky_mask_str(const ac_state *st, PyObject *s)
{
    ac_conf c = {NULL, 0, 0};
    ac_error err;
    const char *u;
    Py_ssize_t n;
    unsigned mask;

    if (ac_conf_chars(s, &u, &n) < 0) {
        PyErr_Clear(); /* a str allocconf holds: only MemoryError */
        return ac_restorable(st) << AC_NSTICKY;
    }
    if (ac_conf_parse(u, (size_t)n, &c, &err) < 0) {
        return ac_restorable(st) << AC_NSTICKY;
    }
    mask = ac_sticky_mask(&c);
    ac_conf_clear(&c);
    return mask;
}

/* The layers as one configuration, into the empty *out: the user's with
 * the other components' keys on top, or theirs alone when `whole`.  0,
 * or -1 when out of memory. */
static int
merged(const ac_conf *user, const ac_conf *foreign, int whole, ac_conf *out)
{
    if (ac_conf_copy(out, whole ? foreign : user) < 0) {
        return -1;
    }
    if (!whole && foreign->len > 0 && ac_conf_update(out, foreign) < 0) {
        ac_conf_clear(out);
        return -1;
    }
    return 0;
}

/* Whether allocconf's default (expandable segments on) goes into the
 * strings: ALLOCCONF_AUTO, unless it stepped back for a neighbour, the
 * user opted out in a variable torch does not apply, or torch refused
 * allocconf's configuration at attach. */
static int
default_on(const ac_state *st)
{
    return st->auto_on && st->stepped_back == NULL && st->opt_out == NULL &&
           st->refused == NULL && st->block != AC_BLOCK_ASYNC;
}

/* Whether torch's CUDA allocator loaded an asynchronous backend
 * (backend:cudaMallocAsync): it has no expandable segments, so windows
 * write nothing, and only a backend key saying so can be written. */
static int
async_loaded(const ac_state *st)
{
    return st->block == AC_BLOCK_ASYNC;
}

/* Whether c's backend key (if any) may be written to a torch whose CUDA
 * allocator loaded an asynchronous backend (`async`) or not: torch
 * accepts the backend it loaded and refuses any other at run time, so a
 * backend key read from a variable that allocator does not read stays
 * out. */
static int
backend_fits(const ac_conf *c, int async)
{
    const char *b = ac_conf_get(c, "backend");
    return b == NULL || (strcmp(b, "native") != 0) == async;
}

/* A new str: c with expandable_segments set to es (-1: as it is), its
 * backend kept where it fits (backend_fits: torch's getter then says it
 * as the user wrote it); *mask its sticky keys.  NULL on error. */
static PyObject *
with_es(const ac_conf *c, int es, int async, unsigned *mask)
{
    ac_conf tmp = {NULL, 0, 0};
    char *s;
    PyObject *r;

    if (ac_conf_copy(&tmp, c) < 0 ||
        (es >= 0 && ac_conf_set(&tmp, "expandable_segments",
                                es ? "True" : "False") < 0)) {
        ac_conf_clear(&tmp);
        return PyErr_NoMemory();
    }
    *mask = ac_sticky_mask(&tmp);
    s = ac_conf_serialise(&tmp, backend_fits(&tmp, async) ? NULL : "backend");
    ac_conf_clear(&tmp);
    if (s == NULL) {
        return PyErr_NoMemory();
    }
    r = PyUnicode_FromString(s);
    free(s);
    return r;
}

static void
strings_clear(ac_next *n)
{
    Py_CLEAR(n->base);
    Py_CLEAR(n->on);
    Py_CLEAR(n->off);
}

/* Build n's strings from its layers.  The layers' own expandable_segments
 * wins; otherwise `dflt` puts True in.  When only the user's layer counts
 * and nothing is added, base is the user's string itself, so that a
 * restore gives back exactly what the user wrote.  Under an asynchronous
 * backend (`async`) the windows' strings are base itself: there is
 * nothing to hold.  0 or -1. */
static int
build_strings(ac_next *n, int dflt, int async)
{
    ac_conf all = {NULL, 0, 0};
    PyObject *raw = !n->whole && n->foreign.len == 0 ? n->user_raw : NULL;
    int es, rc = -1;

    if (merged(&n->user, &n->foreign, n->whole, &all) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    es = ac_conf_es(&all);
    n->base_es = es >= 0 ? es : (dflt ? 1 : -1);
    if (raw != NULL && n->base_es == es && backend_fits(&all, async)) {
        n->base = Py_NewRef(raw);
        n->mask_base = ac_sticky_mask(&all);
    }
    else {
        n->base = with_es(&all, n->base_es, async, &n->mask_base);
    }
    if (n->base != NULL) {
        n->mask_on = n->mask_off = n->mask_base;
        n->on = n->base_es == 1 || async
                    ? Py_NewRef(n->base)
                    : with_es(&all, 1, async, &n->mask_on);
        n->off = n->base_es == 0 || async
                     ? Py_NewRef(n->base)
                     : with_es(&all, 0, async, &n->mask_off);
        rc = n->on == NULL || n->off == NULL ? -1 : 0;
    }
    if (rc < 0) {
        strings_clear(n);
    }
    ac_conf_clear(&all);
    return rc;
}

void
ac_next_clear(ac_next *n)
{
    ac_conf_clear(&n->user);
    ac_conf_clear(&n->foreign);
    Py_CLEAR(n->user_raw);
    strings_clear(n);
}

void
ac_next_swap(ac_state *st, ac_next *n)
{
    ac_next old = {st->user,      st->foreign, st->whole,   st->user_raw,
                   st->str_base,  st->str_on,  st->str_off, st->base_es,
                   st->mask_base, st->mask_on, st->mask_off};

    st->user = n->user;
    st->foreign = n->foreign;
    st->whole = n->whole;
    st->user_raw = n->user_raw;
    st->str_base = n->base;
    st->str_on = n->on;
    st->str_off = n->off;
    st->base_es = n->base_es;
    st->mask_base = n->mask_base;
    st->mask_on = n->mask_on;
    st->mask_off = n->mask_off;
    *n = old;
}

/* n (empty) as a copy of the state's layers.  0, or -1 with an exception
 * set. */
static int
next_of_state(const ac_state *st, ac_next *n)
{
    if (ac_conf_copy(&n->user, &st->user) < 0 ||
        ac_conf_copy(&n->foreign, &st->foreign) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    n->whole = st->whole;
    n->user_raw = Py_XNewRef(st->user_raw);
    return 0;
}

int
ac_adopt_user_locked(ac_state *st, ac_conf *parsed, PyObject *raw, int auto_on,
                     const char *source)
{
    ac_next n = AC_NEXT_INIT;
    int old_auto = st->auto_on, rc = -1;

    n.user = *parsed;
    *parsed = (ac_conf){NULL, 0, 0};
    n.user_raw = Py_NewRef(raw);
    st->auto_on = auto_on; /* default_on() reads it */
    if (ac_conf_copy(&n.foreign, &st->foreign) < 0) {
        PyErr_NoMemory();
    }
    else {
        n.whole = st->whole;
        rc = build_strings(&n, default_on(st), async_loaded(st));
    }
    if (rc < 0) {
        st->auto_on = old_auto;
    }
    else {
        ac_next_swap(st, &n);
        st->source = source;
    }
    ac_next_clear(&n);
    return rc;
}

int
ac_rebuild_locked(ac_state *st)
{
    ac_next n = AC_NEXT_INIT;
    int rc = next_of_state(st, &n);

    if (rc == 0) {
        rc = build_strings(&n, default_on(st), async_loaded(st));
    }
    if (rc == 0) {
        ac_next_swap(st, &n);
    }
    ac_next_clear(&n);
    return rc;
}

PyObject *
ac_target_locked(ac_state *st, unsigned *mask)
{
    if (st->n_off > 0) {
        *mask = st->mask_off;
        return st->str_off;
    }
    if (st->n_on > 0) {
        *mask = st->mask_on;
        return st->str_on;
    }
    *mask = st->mask_base;
    return st->str_base;
}

PyObject *
ac_next_target(const ac_state *st, const ac_next *n)
{
    return st->n_off > 0 ? n->off : st->n_on > 0 ? n->on : n->base;
}

PyObject *
ac_checked_string(ac_state *st, const ac_conf *c, const char *skip_key)
{
    ac_conf check = {NULL, 0, 0};
    ac_error err;
    PyObject *r;
    char *s = ac_conf_serialise(c, skip_key);

    if (s == NULL) {
        return PyErr_NoMemory();
    }
    r = PyUnicode_FromString(s);
    if (r != NULL && ac_conf_parse(s, strlen(s), &check, &err) < 0) {
        ac_raise(st, &err, r);
        Py_CLEAR(r);
    }
    ac_conf_clear(&check);
    free(s);
    return r;
}

/* Why configure() will not make the user's layer `user`, as a new str,
 * or NULL when it will (an error set only when out of memory). */
static PyObject *
configure_refusal(const ac_state *st, const ac_conf *user, unsigned mask)
{
    const char *old_b = ac_conf_get(&st->user, "backend");
    const char *new_b = ac_conf_get(user, "backend");
    int i;

    if (strcmp(old_b ? old_b : "native", new_b ? new_b : "native") != 0) {
        return PyUnicode_FromFormat(
            "backend: torch reads it once, when it loads (here: %s); it "
            "cannot become '%s' at run time",
            old_b ? old_b : "native", new_b ? new_b : "native");
    }
    for (i = 0; i < AC_NSTICKY; i++) {
        unsigned bit = 1u << i;
        if (ac_sticky_default(i) == NULL && st->attached &&
            (AC_STICKY_OFF(st->mask_in_force) & bit) &&
            !(AC_STICKY_NAMED(mask) & bit)) {
            return PyUnicode_FromFormat(
                "%s: torch keeps it once written and has no value that "
                "gives its default back; set the value you want instead of "
                "removing it",
                ac_sticky_key(i));
        }
    }
    return NULL;
}

int
ac_next_configure(ac_state *st, const ac_conf *add, const ac_conf *patch,
                  ac_next *n, PyObject **refusal)
{
    *refusal = NULL;
    if (ac_conf_copy(&n->user, &st->user) < 0 ||
        ac_conf_copy(&n->foreign, &st->foreign) < 0 ||
        (add != NULL && (ac_conf_update(&n->user, add) < 0 ||
                         ac_conf_drop(&n->foreign, add) < 0)) ||
        (patch != NULL && (ac_conf_update(&n->user, patch) < 0 ||
                           ac_conf_drop(&n->foreign, patch) < 0))) {
        PyErr_NoMemory();
        return -1;
    }
    n->whole = 0; /* the user's layer is the floor again */
    n->user_raw = ac_checked_string(st, &n->user, NULL);
    if (n->user_raw == NULL ||
        build_strings(n, default_on(st), async_loaded(st)) < 0) {
        return -1;
    }
    *refusal = configure_refusal(st, &n->user, n->mask_base);
    return *refusal != NULL || PyErr_Occurred() ? -1 : 0;
}

int
ac_next_foreign(ac_state *st, const ac_conf *s, ac_next *n)
{
    if (ac_conf_copy(&n->user, &st->user) < 0 ||
        ac_conf_copy(&n->foreign, s) < 0 ||
        ac_conf_set(&n->foreign, "backend", NULL) < 0 ||
        ac_sticky_carry(&n->foreign, &st->foreign) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    n->whole = st->whole;
    n->user_raw = Py_XNewRef(st->user_raw);
    return build_strings(n, default_on(st), async_loaded(st));
}

int
ac_next_unseen(ac_state *st, const ac_conf *held, ac_next *n)
{
    ac_conf before = {NULL, 0, 0};
    int ok;

    n->whole = st->whole || !st->keep_foreign;
    /* What torch kept of the sticky keys: the other components' alone
     * when the user's layer still applies, else everything it held. */
    ok = ac_conf_copy(&n->user, &st->user) == 0 &&
         merged(&st->user, &st->foreign, n->whole ? st->whole : 1, &before) ==
             0 &&
         (held == NULL || ac_conf_copy(&n->foreign, held) == 0) &&
         ac_conf_set(&n->foreign, "backend", NULL) == 0 &&
         ac_sticky_carry(&n->foreign, &before) == 0;
    ac_conf_clear(&before);
    if (!ok) {
        PyErr_NoMemory();
        return -1;
    }
    n->user_raw = Py_XNewRef(st->user_raw);
    return build_strings(n, default_on(st), async_loaded(st));
}

int
ac_next_fall_back(ac_state *st, const ac_conf *held, ac_next *n)
{
    if (ac_conf_copy(&n->user, &st->user) < 0 ||
        ac_conf_copy(&n->foreign, held) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    n->whole = 1;
    n->user_raw = Py_XNewRef(st->user_raw);
    /* No default of allocconf's on top: torch holds what it holds. */
    return build_strings(n, 0, async_loaded(st));
}
