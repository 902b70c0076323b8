/*
 * config.c -- the user's configuration and the three strings a write can
 * carry: the configuration with expandable_segments as allocconf wants it
 * (str_base), forced on (str_on) and forced off (str_off).  They are built
 * once per change, so that a window only picks one; configure() merges,
 * checks, commits and writes, and puts everything back if torch refuses.
 */
#include "config.h"
#include "environ.h"
#include "errors.h"
#include "torch.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    PyObject *base;
    PyObject *on;
    PyObject *off;
    int base_es;
    unsigned mask_base, mask_on, mask_off;
} strings;

static void
strings_clear(strings *w)
{
    Py_CLEAR(w->base);
    Py_CLEAR(w->on);
    Py_CLEAR(w->off);
}

int
ac_conf_es(const ac_conf *c)
{
    const char *v = ac_conf_get(c, "expandable_segments");
    if (v == NULL) {
        return -1;
    }
    return strcmp(v, "True") == 0;
}

/* A new str: `user` with expandable_segments set to es (-1: as it is),
 * backend left out (torch reads it once, at load); *mask its sticky
 * keys.  NULL on error. */
static PyObject *
with_es(const ac_conf *user, int es, unsigned *mask)
{
    ac_conf tmp = {NULL, 0, 0};
    char *s;
    PyObject *r;

    if (ac_conf_copy(&tmp, user) < 0 ||
        (es >= 0 && ac_conf_set(&tmp, "expandable_segments",
                                es ? "True" : "False") < 0)) {
        ac_conf_clear(&tmp);
        return PyErr_NoMemory();
    }
    *mask = ac_sticky_mask(&tmp);
    s = ac_conf_serialise(&tmp, "backend");
    ac_conf_clear(&tmp);
    if (s == NULL) {
        return PyErr_NoMemory();
    }
    r = PyUnicode_FromString(s);
    free(s);
    return r;
}

/* Compute the strings for `user` (held by torch as `raw`, a str).  The
 * user's own expandable_segments wins; otherwise ALLOCCONF_AUTO puts True
 * in.  When nothing changes, base is `raw` itself, so that a restore gives
 * back exactly the string the user wrote.  0 or -1. */
static int
build_strings(const ac_conf *user, PyObject *raw, int auto_on, strings *w)
{
    int user_es = ac_conf_es(user);
    int base_es = user_es >= 0 ? user_es : (auto_on ? 1 : -1);

    w->base_es = base_es;
    if (base_es == user_es && ac_conf_get(user, "backend") == NULL) {
        w->base = Py_NewRef(raw);
        w->mask_base = ac_sticky_mask(user);
    }
    else {
        w->base = with_es(user, base_es, &w->mask_base);
    }
    if (w->base == NULL) {
        return -1;
    }
    w->mask_on = w->mask_base;
    w->mask_off = w->mask_base;
    w->on = base_es == 1 ? Py_NewRef(w->base) : with_es(user, 1, &w->mask_on);
    w->off =
        base_es == 0 ? Py_NewRef(w->base) : with_es(user, 0, &w->mask_off);
    if (w->on == NULL || w->off == NULL) {
        strings_clear(w);
        return -1;
    }
    return 0;
}

/* Exchange w with the state's strings (so w holds the old ones). */
static void
strings_swap(ac_state *st, strings *w)
{
    strings old = {st->str_base,  st->str_on,  st->str_off, st->base_es,
                   st->mask_base, st->mask_on, st->mask_off};

    st->str_base = w->base;
    st->str_on = w->on;
    st->str_off = w->off;
    st->base_es = w->base_es;
    st->mask_base = w->mask_base;
    st->mask_on = w->mask_on;
    st->mask_off = w->mask_off;
    *w = old;
}

/* Whether allocconf's default (expandable segments on) goes into the
 * strings: ALLOCCONF_AUTO, unless it stepped back for a neighbour or the
 * user opted out in a variable torch does not read. */
static int
default_on(const ac_state *st, int auto_on)
{
    return auto_on && st->stepped_back == NULL && st->opt_out == NULL;
}

int
ac_adopt_user_locked(ac_state *st, ac_conf *parsed, PyObject *raw, int auto_on,
                     const char *source)
{
    strings w = {NULL, NULL, NULL, -1, 0, 0, 0};

    if (build_strings(parsed, raw, default_on(st, auto_on), &w) < 0) {
        ac_conf_clear(parsed);
        return -1;
    }
    ac_conf_clear(&st->user);
    st->user = *parsed;
    *parsed = (ac_conf){NULL, 0, 0};
    Py_XSETREF(st->user_raw, Py_NewRef(raw));
    strings_swap(st, &w);
    strings_clear(&w);
    st->source = source;
    st->auto_on = auto_on;
    return 0;
}

int
ac_fall_back_locked(ac_state *st)
{
    ac_conf held = {NULL, 0, 0};
    strings w = {NULL, NULL, NULL, -1, 0, 0, 0};
    ac_error err;
    const char *s;
    Py_ssize_t n;

    if (st->in_force == NULL || ac_conf_chars(st->in_force, &s, &n) < 0) {
        PyErr_Clear();
        st->block = AC_BLOCK_REFUSED;
        return 0;
    }
    if (ac_conf_parse(s, (size_t)n, &held, &err) < 0) {
        if (err.nomem) {
            PyErr_NoMemory();
            return -1;
        }
        st->block = AC_BLOCK_REFUSED;
        return 0;
    }
    /* No default of allocconf's on top: torch holds what it holds. */
    if (build_strings(&held, st->in_force, 0, &w) < 0) {
        ac_conf_clear(&held);
        return -1;
    }
    ac_conf_clear(&held);
    strings_swap(st, &w);
    strings_clear(&w);
    return 0;
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

/* Why `merged` cannot replace the user's configuration, as a new str, or
 * NULL when it can (an error set only when out of memory). */
static PyObject *
merge_refusal_locked(ac_state *st, const ac_conf *merged, unsigned mask)
{
    const char *old_b = ac_conf_get(&st->user, "backend");
    const char *new_b = ac_conf_get(merged, "backend");
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

PyObject *
ac_merge_write_locked(ac_state *st, const ac_conf *add, const ac_conf *patch,
                      PyObject *writer, int foreign, ac_outcome *o)
{
    ac_conf merged = {NULL, 0, 0}, old_user;
    strings w = {NULL, NULL, NULL, -1, 0, 0, 0};
    PyObject *raw = NULL, *old_raw, *old_writer, *result = NULL;
    int old_configured;
    unsigned mask;

    if (!st->loaded) {
        /* Only reached when _C is used without the package's __init__. */
        PyObject *ignored = PyList_New(0);
        int rc = ignored == NULL ? -1 : ac_load_locked(st, ignored);
        Py_XDECREF(ignored);
        if (rc < 0) {
            return NULL;
        }
    }
    if (st->block == AC_BLOCK_MALFORMED) {
        o->refusal = PyUnicode_FromFormat(
            "allocconf: %s is malformed (%V); fix it before configure() can "
            "merge into it",
            st->source, st->block_detail, "?");
        return NULL;
    }
    if (ac_conf_copy(&merged, &st->user) < 0 ||
        (add != NULL && ac_conf_update(&merged, add) < 0) ||
        (patch != NULL && ac_conf_update(&merged, patch) < 0)) {
        PyErr_NoMemory();
        goto done;
    }
    raw = ac_checked_string(st, &merged, "backend");
    if (raw == NULL ||
        build_strings(&merged, raw, default_on(st, st->auto_on), &w) < 0) {
        goto done;
    }
    /* A foreign write only names keys, and torch keeps what it keeps
     * whatever allocconf thinks: no refusal of allocconf's for it. */
    if (!foreign) {
        o->refusal = merge_refusal_locked(st, &merged, w.mask_base);
        if (o->refusal != NULL || PyErr_Occurred()) {
            goto done;
        }
    }
    /* Commit, write, and roll back if torch refuses. */
    old_user = st->user;
    old_raw = st->user_raw;
    old_writer = st->writer;
    old_configured = st->configured;
    st->user = merged;
    st->user_raw = raw;
    st->writer = Py_NewRef(writer);
    st->configured = 1;
    strings_swap(st, &w);
    if (ac_sync_locked(st, foreign ? "kept a write by another component; "
                                     "wrote"
                                   : "configure() wrote") < 0) {
        o->torch_exc = PyErr_GetRaisedException();
        o->target = Py_NewRef(ac_target_locked(st, &mask));
        st->user = old_user;
        st->user_raw = old_raw;
        Py_SETREF(st->writer, old_writer);
        st->configured = old_configured;
        strings_swap(st, &w);
        goto done; /* merged and raw are freed below */
    }
    ac_conf_clear(&old_user);
    Py_XDECREF(old_raw);
    Py_XDECREF(old_writer);
    merged = (ac_conf){NULL, 0, 0};
    raw = NULL;
    result = Py_NewRef(st->str_base);
done:
    ac_conf_clear(&merged);
    Py_XDECREF(raw);
    strings_clear(&w);
    return result;
}

int
ac_rebuild_locked(ac_state *st)
{
    strings w = {NULL, NULL, NULL, -1, 0, 0, 0};

    if (build_strings(&st->user, st->user_raw, default_on(st, st->auto_on),
                      &w) < 0) {
        return -1;
    }
    strings_swap(st, &w);
    strings_clear(&w);
    return 0;
}

PyObject *
ac_configure(ac_state *st, PyObject *conf, const ac_conf *patch)
{
    static const char writer_text[] = "allocconf.configure()";
    ac_conf add = {NULL, 0, 0};
    ac_outcome o = {NULL, NULL, NULL};
    PyObject *result, *writer;
    ac_error err;

    /* The new text is parsed before the lock: nothing of the user's runs
     * under it. */
    if (conf != NULL) {
        const char *s;
        Py_ssize_t n;
        if (ac_conf_chars(conf, &s, &n) < 0) {
            return NULL;
        }
        if (ac_conf_parse(s, (size_t)n, &add, &err) < 0) {
            return ac_raise(st, &err, conf);
        }
    }
    writer = PyUnicode_FromString(writer_text);
    if (writer == NULL || ac_lock(st) < 0) {
        Py_XDECREF(writer);
        ac_conf_clear(&add);
        return NULL;
    }
    result = ac_merge_write_locked(st, &add, patch, writer, 0, &o);
    ac_unlock(st);
    if (o.refusal != NULL) {
        ac_raise_plain(st, o.refusal, NULL);
    }
    if (o.target != NULL) {
        ac_raise_refused(st, o.target, o.torch_exc);
        Py_DECREF(o.target);
    }
    Py_DECREF(writer);
    ac_conf_clear(&add);
    return result;
}
