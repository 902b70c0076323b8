/*
 * torch.c -- everything allocconf asks of torch and writes to it.
 *
 * Attaching has two halves: probe() looks up torch's setter, version and
 * build and reads what it holds, all of which runs torch's code, without
 * the lock; attach_locked() then commits what was found and writes.  A
 * write happens only when the string torch should hold differs from the
 * one it holds, always under the lock, so the order of writes is the
 * order of the changes that caused them.
 */
#include "torch.h"
#include "config.h"
#include "environ.h"
#include "errors.h"

#include <stdlib.h>
#include <string.h>

/* torch 2.10's setter: a torch that has it also reads PYTORCH_ALLOC_CONF
 * for CUDA (environ.c). */
#define GENERIC_SETTER "torch._C._accelerator_setAllocatorSettings"

/* ------------------------------------------------------------------ */
/* Writing                                                              */
/* ------------------------------------------------------------------ */

/* The sticky keys whose default can be written back to this torch. */
static unsigned
restorable(const ac_state *st)
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

/* A new str: "k:default,..." for the sticky keys in `bits` that have a
 * default, then `s`.  NULL on error. */
static PyObject *
with_defaults(PyObject *s, unsigned bits)
{
    PyObject *r = Py_NewRef(s);
    int i;

    for (i = AC_NSTICKY - 1; i >= 0 && r != NULL; i--) {
        const char *d = ac_sticky_default(i);
        if ((bits & (1u << i)) && d != NULL) {
            Py_SETREF(r, PyUnicode_FromFormat(
                             "%s:%s%s%U", ac_sticky_key(i), d,
                             PyUnicode_GET_LENGTH(r) ? "," : "", r));
        }
    }
    return r;
}

/* The sticky keys of a string torch holds (ac_sticky_mask); when it does
 * not parse, every key with a default counts as off it. */
static unsigned
mask_of(const ac_state *st, PyObject *s)
{
    ac_conf c = {NULL, 0, 0};
    ac_error err;
    const char *u;
    Py_ssize_t n;
    unsigned mask;

    if (ac_conf_chars(s, &u, &n) < 0) {
        PyErr_Clear();
        return restorable(st) << AC_NSTICKY;
    }
    if (ac_conf_parse(u, (size_t)n, &c, &err) < 0) {
        return restorable(st) << AC_NSTICKY;
    }
    mask = ac_sticky_mask(&c);
    ac_conf_clear(&c);
    return mask;
}

/* Call torch's setter with `s`.  0, or -1 with its exception set. */
static int
call_setter(ac_state *st, PyObject *s)
{
    PyObject *r = PyObject_CallOneArg(st->setter, s);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* After torch refused a write naming the sticky keys `named`: torch
 * parses in stages and keeps what it read before refusing, so hand it
 * back the string it held, with the defaults of the sticky keys the
 * refused write named and that string does not.  Keeps the exception
 * set. */
static void
give_back(ac_state *st, unsigned named)
{
    PyObject *exc, *back;

    if (st->in_force == NULL) {
        return;
    }
    exc = PyErr_GetRaisedException();
    back = with_defaults(st->in_force,
                         named & ~AC_STICKY_NAMED(st->mask_in_force));
    if (back == NULL || call_setter(st, back) < 0) {
        PyErr_Clear();
    }
    Py_XDECREF(back);
    PyErr_SetRaisedException(exc);
}

int
ac_sync_locked(ac_state *st, const char *why)
{
    unsigned mask, named;
    PyObject *target = ac_target_locked(st, &mask), *write;

    if (!st->attached || st->block != AC_OK || st->setter == NULL ||
        target == NULL || target == st->in_force) {
        return 0;
    }
    if (st->in_force != NULL) {
        int same = PyUnicode_Compare(target, st->in_force);
        if (same == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (same == 0) {
            return 0;
        }
    }
    /* Sticky keys torch holds that the target leaves out get their
     * default, or torch would keep them (facts §2). */
    named = st->in_force == NULL
                ? restorable(st)
                : AC_STICKY_OFF(st->mask_in_force) & ~AC_STICKY_NAMED(mask);
    write = with_defaults(target, named);
    if (write == NULL) {
        return -1;
    }
    named |= AC_STICKY_NAMED(mask);
    if (call_setter(st, write) < 0) {
        give_back(st, named);
        Py_DECREF(write);
        return -1;
    }
    Py_XSETREF(st->in_force, write);
    st->mask_in_force = mask;
    st->writes++;
    ac_trace_locked(st, why, write);
    return 0;
}

int
ac_write_as_is_locked(ac_state *st, PyObject *s, const char *why)
{
    if (call_setter(st, s) < 0) {
        give_back(st, AC_STICKY_NAMED(mask_of(st, s)));
        return -1;
    }
    Py_XSETREF(st->in_force, Py_NewRef(s));
    st->mask_in_force = mask_of(st, s);
    ac_trace_locked(st, why, s);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Looking things up                                                    */
/* ------------------------------------------------------------------ */

/* getattr(obj, name) or NULL with no exception when it is missing.
 * Returns NULL with an exception set only for other errors. */
static PyObject *
getattr_opt(PyObject *obj, const char *name)
{
    PyObject *r = NULL;

    if (obj == NULL) {
        return NULL;
    }
    if (PyObject_GetOptionalAttrString(obj, name, &r) < 0) {
        return NULL;
    }
    return r;
}

/* A new reference to obj.a.b.c (names separated by '.'), or NULL with no
 * exception when any part is missing or raises. */
static PyObject *
lookup(PyObject *obj, const char *dotted)
{
    char name[64];
    PyObject *cur = Py_NewRef(obj);

    while (cur != NULL && *dotted) {
        size_t n = strcspn(dotted, ".");
        PyObject *next;
        if (n >= sizeof(name)) {
            Py_CLEAR(cur);
            break;
        }
        memcpy(name, dotted, n);
        name[n] = '\0';
        next = getattr_opt(cur, name);
        Py_DECREF(cur);
        cur = next;
        dotted += n + (dotted[n] == '.');
    }
    if (cur == NULL) {
        PyErr_Clear();
    }
    return cur;
}

/* The configuration string torch holds now, where it can tell without
 * initialising CUDA: the 2.13+ getter, or the snapshot's record once
 * CUDA is already up.  A new str, or NULL with no exception set. */
PyObject *
ac_read_live(PyObject *torch)
{
    PyObject *f, *r = NULL, *settings = NULL;
    static const char *const keys[] = {"PYTORCH_CUDA_ALLOC_CONF",
                                       "PYTORCH_ALLOC_CONF"};
    size_t i;

    f = lookup(torch, "_C._accelerator_getAllocatorSettings");
    if (f != NULL) {
        r = PyObject_CallNoArgs(f);
        Py_DECREF(f);
        goto done;
    }
    f = lookup(torch, "cuda.is_initialized");
    if (f == NULL) {
        return NULL;
    }
    r = PyObject_CallNoArgs(f);
    Py_DECREF(f);
    if (r == NULL || PyObject_IsTrue(r) != 1) {
        Py_XDECREF(r);
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(r);
    r = NULL;
    f = lookup(torch, "cuda.memory._snapshot");
    if (f == NULL) {
        return NULL;
    }
    settings = PyObject_CallNoArgs(f);
    Py_DECREF(f);
    if (settings == NULL || !PyDict_Check(settings)) {
        goto done;
    }
    f = PyDict_GetItemString(settings, "allocator_settings"); /* borrowed */
    if (f == NULL || !PyDict_Check(f)) {
        goto done;
    }
    for (i = 0; i < 2 && r == NULL; i++) {
        r = Py_XNewRef(PyDict_GetItemString(f, keys[i]));
    }
done:
    Py_XDECREF(settings);
    if (r == NULL || !PyUnicode_Check(r)) {
        Py_XDECREF(r);
        PyErr_Clear();
        return NULL;
    }
    return r;
}

/* ------------------------------------------------------------------ */
/* Attaching                                                            */
/* ------------------------------------------------------------------ */

/* What torch offers, found without the lock. */
typedef struct {
    PyObject *setter;  /* callable, or NULL */
    const char *api;   /* static: the setter's name */
    PyObject *version; /* torch.__version__, or NULL */
    PyObject *cuda;    /* torch.version.cuda, or NULL */
    PyObject *hip;     /* torch.version.hip, or NULL */
    PyObject *live;    /* the string torch holds, or NULL */
    PyObject *refusal; /* out: torch's exception when it refused */
    PyObject *target;  /* out: the string it refused */
} probe;

static void
probe_clear(probe *p)
{
    Py_CLEAR(p->setter);
    Py_CLEAR(p->version);
    Py_CLEAR(p->cuda);
    Py_CLEAR(p->hip);
    Py_CLEAR(p->live);
    Py_CLEAR(p->refusal);
    Py_CLEAR(p->target);
}

/* Find torch's setter and its ROCm version: what says which variables it
 * reads.  Runs torch's code: no lock. */
static void
probe_api(PyObject *torch, probe *p)
{
    static const struct {
        const char *path;
        const char *api;
    } candidates[] = {
        {"_C._accelerator_setAllocatorSettings", GENERIC_SETTER},
        {"_C._cuda_cudaCachingAllocator_set_allocator_settings",
         "torch._C._cuda_cudaCachingAllocator_set_allocator_settings"},
        /* Deprecated (FutureWarning on 2.11), so only when neither of the
         * above exists. */
        {"cuda.memory._set_allocator_settings",
         "torch.cuda.memory._set_allocator_settings"},
    };
    size_t i;

    for (i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++) {
        PyObject *f = lookup(torch, candidates[i].path);
        if (f != NULL && PyCallable_Check(f)) {
            p->setter = f;
            p->api = candidates[i].api;
            break;
        }
        Py_XDECREF(f);
    }
    p->hip = lookup(torch, "version.hip");
}

/* The variables a torch so probed reads (environ.c); *generic: it has the
 * 2.10 setter. */
static unsigned
reads_of(const probe *p, int *generic)
{
    *generic = p->api != NULL && strcmp(p->api, GENERIC_SETTER) == 0;
    return ac_env_reads(p->hip != NULL && PyUnicode_Check(p->hip), *generic);
}

int
ac_torch_reads(PyObject *torch, unsigned *reads, int *generic)
{
    probe p = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};

    probe_api(torch, &p);
    *reads = reads_of(&p, generic);
    probe_clear(&p);
    return PyErr_Occurred() ? -1 : 0;
}

/* Look torch over, by capability.  Runs torch's code: no lock. */
static void
probe_torch(PyObject *torch, probe *p)
{
    probe_api(torch, p);
    p->version = lookup(torch, "__version__");
    p->cuda = lookup(torch, "version.cuda");
    p->live = ac_read_live(torch);
}

/* Decide from torch's build whether a write can do anything.  Lock held;
 * 0 or -1. */
static int
check_build_locked(ac_state *st, const probe *p)
{
    st->cpu_only = (p->cuda == NULL || p->cuda == Py_None) &&
                   (p->hip == NULL || p->hip == Py_None);
    if (st->block != AC_OK) {
        return 0;
    }
#if defined(_WIN32) || defined(__APPLE__)
    st->block = AC_BLOCK_PLATFORM;
    return 0;
#endif
    if (p->hip != NULL && PyUnicode_Check(p->hip)) {
        const char *v = PyUnicode_AsUTF8(p->hip);
        if (v == NULL) {
            return -1;
        }
        if (atoi(v) < 7) {
            Py_XSETREF(st->block_detail, Py_NewRef(p->hip));
            st->block = AC_BLOCK_ROCM;
            return 0;
        }
    }
    if (st->setter == NULL) {
        st->block = AC_BLOCK_NO_SETTER;
    }
    return 0;
}

/* Adopt the live string as the user's configuration when the user set one
 * through torch before allocconf saw it.  Lock held; 0 or -1. */
static int
adopt_live_locked(ac_state *st, PyObject *live, PyObject *warnings)
{
    ac_conf parsed = {NULL, 0, 0};
    ac_error err;
    const char *s;
    Py_ssize_t n;
    PyObject *msg;
    int same = PyUnicode_Compare(live, st->user_raw);

    if (same == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (same == 0 || PyUnicode_GET_LENGTH(live) == 0 ||
        st->block == AC_BLOCK_MALFORMED) {
        return 0;
    }
    if (ac_conf_chars(live, &s, &n) < 0) {
        return -1;
    }
    if (ac_conf_parse(s, (size_t)n, &parsed, &err) == 0) {
        return ac_adopt_user_locked(st, &parsed, live, st->auto_on, "torch");
    }
    msg = ac_error_message(&err, live);
    if (msg == NULL) {
        return -1;
    }
    Py_SETREF(msg, PyUnicode_FromFormat(
                       "allocconf: torch holds a configuration allocconf "
                       "cannot read (%U); using %s",
                       msg, st->source ? st->source : "the defaults"));
    return ac_warn_append(warnings, msg);
}

/* Attach with the lock held, committing what probe_torch found.  A
 * refused write is not an error: p->refusal and p->target say what
 * happened, and the strings fall back on what torch holds.  0 or -1. */
static int
attach_locked(ac_state *st, void *arg, PyObject *warnings)
{
    probe *p = arg;
    unsigned mask, reads, before;
    int generic;

    if (st->attached) {
        return 0;
    }
    /* Read what this torch reads: the variables differ by build and
     * version (environ.c). */
    reads = reads_of(p, &generic);
    before = ac_env_reads_of(st);
    ac_env_set_reads_locked(st, reads, generic);
    if (!st->configured) {
        /* The user may have changed the environment between
         * `import allocconf` and `import torch`: torch reads it later. */
        PyObject *snap = ac_env_snapshot();
        int same;
        if (snap == NULL) {
            return -1;
        }
        same = st->env_seen != NULL &&
               PyObject_RichCompareBool(snap, st->env_seen, Py_EQ) == 1 &&
               ac_env_first(reads) == ac_env_first(before) &&
               ac_env_first(AC_READS_BACKEND(reads)) ==
                   ac_env_first(AC_READS_BACKEND(before));
        Py_DECREF(snap);
        if (!same && ac_load_locked(st, warnings) < 0) {
            return -1;
        }
    }
    if (ac_env_opt_out_locked(st) < 0) {
        return -1;
    }
    if (p->api != NULL) {
        PyObject *api = PyUnicode_FromString(p->api);
        if (api == NULL) {
            return -1;
        }
        Py_XSETREF(st->api, api);
        Py_XSETREF(st->setter, p->setter);
        p->setter = NULL;
    }
    Py_XSETREF(st->torch_version, Py_XNewRef(p->version));
    if (check_build_locked(st, p) < 0) {
        return -1;
    }
    if (p->live != NULL && !st->configured &&
        adopt_live_locked(st, p->live, warnings) < 0) {
        return -1;
    }
    /* What torch holds: the live string, else the variable it will read
     * (not a configure() result: that is not written yet). */
    Py_XSETREF(st->in_force,
               Py_NewRef(p->live != NULL ? p->live : st->env_raw));
    st->mask_in_force = mask_of(st, st->in_force);
    st->attached = 1;
    ac_trace_locked(st, "torch imported; it holds", st->in_force);
    if (ac_sync_locked(st, "wrote") < 0) {
        p->refusal = PyErr_GetRaisedException();
        p->target = Py_NewRef(ac_target_locked(st, &mask));
        return ac_fall_back_locked(st);
    }
    return 0;
}

/* Record torch's words about a refused write.  Lock held; 0 or -1. */
static int
record_refusal_locked(ac_state *st, void *arg, PyObject *warnings)
{
    PyObject **text = arg;
    (void)warnings;
    Py_XSETREF(st->refused, Py_NewRef(*text));
    return 0;
}

PyObject *
ac_attach(ac_state *st, PyObject *torch)
{
    probe p = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    PyObject *warnings, *text, *ignored;

    probe_torch(torch, &p);
    if (PyErr_Occurred()) {
        probe_clear(&p);
        return NULL;
    }
    warnings = ac_with_warnings(st, attach_locked, &p);
    if (warnings == NULL || p.refusal == NULL) {
        probe_clear(&p);
        return warnings;
    }
    /* Torch refused: say so, outside the lock (str() of its exception is
     * Python code), and keep its words for status(). */
    text = PyObject_Str(p.refusal);
    if (text == NULL) {
        PyErr_Clear();
        text = PyUnicode_FromString("(its error has no text)");
    }
    ignored = text == NULL
                  ? NULL
                  : ac_with_warnings(st, record_refusal_locked, &text);
    Py_XDECREF(ignored);
    if (text == NULL || ignored == NULL ||
        ac_warn_append(warnings,
                       PyUnicode_FromFormat(
                           "allocconf: torch refused '%U': %U; it keeps what "
                           "it held, and windows build on that",
                           p.target, text)) < 0) {
        Py_CLEAR(warnings);
    }
    Py_XDECREF(text);
    probe_clear(&p);
    return warnings;
}
