/*
 * attach.c -- looking torch over, and attaching to it once imported.
 *
 * Attaching has two halves: probe() looks up torch's setter, getter,
 * version and build and reads what it holds, all of which runs torch's
 * code, without the lock, and keeps exact str copies of what it found;
 * attach_locked() then commits that and writes.  A lookup that raises an
 * ordinary error (a lazy torch attribute that fails) counts as missing;
 * KeyboardInterrupt and MemoryError propagate.
 */
#include "state/environ.h"
#include "state/errors.h"
#include "torchio/torch.h"

#include <stdlib.h>
#include <string.h>

/* torch 2.10's setter: a torch that has it also reads PYTORCH_ALLOC_CONF
 * for CUDA (environ.c). */
#define GENERIC_SETTER "torch._C._accelerator_setAllocatorSettings"

/* ------------------------------------------------------------------ */
/* Looking things up                                                    */
/* ------------------------------------------------------------------ */

/* *out = obj.a.b.c (names separated by '.').  1 when found, 0 when a
 * part is missing or raised an ordinary error (*out NULL, no exception),
 * -1 with the exception set when one must propagate. */
static int
lookup(PyObject *obj, const char *dotted, PyObject **out)
{
    char name[64];
    PyObject *cur = Py_NewRef(obj);

    *out = NULL;
    while (*dotted) {
        size_t n = strcspn(dotted, ".");
        PyObject *next = NULL;
        if (n >= sizeof(name)) {
            Py_DECREF(cur);
            return 0;
        }
        memcpy(name, dotted, n);
        name[n] = '\0';
        if (PyObject_GetOptionalAttrString(cur, name, &next) < 0 &&
            !ac_clear_ordinary()) {
            Py_DECREF(cur);
            return -1;
        }
        Py_DECREF(cur);
        if (next == NULL) {
            return 0;
        }
        cur = next;
        dotted += n + (dotted[n] == '.');
    }
    *out = cur;
    return 1;
}

/* *out = an exact str copy of obj when it is a str (no Python code runs
 * for a subclass), else NULL.  0, or -1 when out of memory. */
static int
exact_str(PyObject *obj, PyObject **out)
{
    *out =
        obj != NULL && PyUnicode_Check(obj) ? PyUnicode_FromObject(obj) : NULL;
    return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

/* *out = torch.a.b.c(), the function looked up by dotted name.  1 when
 * it answered, 0 when it is missing or raised an ordinary error (*out
 * NULL, no exception), -1 with the exception set when one must
 * propagate. */
static int
call_path(PyObject *torch, const char *dotted, PyObject **out)
{
    PyObject *f = NULL;
    int rc = lookup(torch, dotted, &f);

    *out = NULL;
    if (rc <= 0) {
        return rc;
    }
    *out = PyObject_CallNoArgs(f);
    Py_DECREF(f);
    if (*out != NULL) {
        return 1;
    }
    return ac_clear_ordinary() ? 0 : -1;
}

/* The record of the string torch's CUDA allocator parsed, in a snapshot
 * (borrowed), or NULL. */
static PyObject *
snapshot_string(PyObject *snapshot)
{
    static const char *const keys[] = {"PYTORCH_CUDA_ALLOC_CONF",
                                       "PYTORCH_ALLOC_CONF"};
    PyObject *settings;
    size_t i;

    if (snapshot == NULL || !PyDict_CheckExact(snapshot)) {
        return NULL;
    }
    settings = PyDict_GetItemString(snapshot, "allocator_settings");
    for (i = 0; settings != NULL && PyDict_CheckExact(settings) && i < 2;
         i++) {
        PyObject *v = PyDict_GetItemString(settings, keys[i]);
        if (v != NULL) {
            return v;
        }
    }
    return NULL;
}

PyObject *
ac_read_live(PyObject *torch)
{
    PyObject *r = NULL, *live = NULL;
    int rc = call_path(torch, "_C._accelerator_getAllocatorSettings", &r);

    if (rc == 0) {
        /* No getter: the snapshot tells, but only once CUDA is up. */
        rc = call_path(torch, "cuda.is_initialized", &r);
        if (rc > 0) {
            int up = r == Py_True;
            Py_CLEAR(r);
            rc = up ? call_path(torch, "cuda.memory._snapshot", &r) : 0;
        }
        if (rc > 0) {
            Py_SETREF(r, Py_XNewRef(snapshot_string(r)));
        }
    }
    if (rc > 0 && exact_str(r, &live) < 0) {
        rc = -1;
    }
    Py_XDECREF(r);
    return rc < 0 ? NULL : live;
}

/* ------------------------------------------------------------------ */
/* Probing                                                              */
/* ------------------------------------------------------------------ */

/* What torch offers, found without the lock: the str are exact copies. */
typedef struct {
    PyObject *setter;  /* callable, or NULL */
    const char *api;   /* static: the setter's name */
    PyObject *getter;  /* callable, or NULL */
    PyObject *version; /* str(torch.__version__), or NULL */
    int cuda;          /* torch.version.cuda is set */
    PyObject *hip;     /* torch.version.hip, or NULL */
    PyObject *live;    /* the string torch holds, or NULL */
    PyObject *refusal; /* out: torch's exception when it refused */
    PyObject *target;  /* out: the string it refused */
} probe;

#define PROBE_INIT                                                            \
    {                                                                         \
        NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL                     \
    }

static void
probe_clear(probe *p)
{
    Py_CLEAR(p->setter);
    Py_CLEAR(p->getter);
    Py_CLEAR(p->version);
    Py_CLEAR(p->hip);
    Py_CLEAR(p->live);
    Py_CLEAR(p->refusal);
    Py_CLEAR(p->target);
}

/* Find torch's setter and its ROCm version: what says which variables it
 * reads.  Runs torch's code: no lock.  0 or -1. */
static int
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
    PyObject *hip = NULL;
    size_t i;
    int rc;

    for (i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++) {
        PyObject *f = NULL;
        if (lookup(torch, candidates[i].path, &f) < 0) {
            return -1;
        }
        if (f != NULL && PyCallable_Check(f)) {
            p->setter = f;
            p->api = candidates[i].api;
            break;
        }
        Py_XDECREF(f);
    }
    if (lookup(torch, "version.hip", &hip) < 0) {
        return -1;
    }
    rc = exact_str(hip, &p->hip);
    Py_XDECREF(hip);
    return rc;
}

/* The variables a torch so probed reads (environ.c); *generic: it has the
 * 2.10 setter. */
static unsigned
reads_of(const probe *p, int *generic)
{
    *generic = p->api != NULL && strcmp(p->api, GENERIC_SETTER) == 0;
    return ac_env_reads(p->hip != NULL, *generic);
}

int
ac_torch_reads(PyObject *torch, unsigned *reads, int *generic)
{
    probe p = PROBE_INIT;
    int rc = probe_api(torch, &p);

    *reads = reads_of(&p, generic);
    probe_clear(&p);
    return rc;
}

/* Look torch over, by capability.  Runs torch's code: no lock.  0 or
 * -1. */
static int
probe_torch(PyObject *torch, probe *p)
{
    PyObject *version = NULL, *cuda = NULL, *text = NULL;
    int rc = -1;

    if (probe_api(torch, p) < 0 ||
        lookup(torch, "_C._accelerator_getAllocatorSettings", &p->getter) <
            0 ||
        lookup(torch, "__version__", &version) < 0 ||
        lookup(torch, "version.cuda", &cuda) < 0) {
        goto done;
    }
    if (p->getter != NULL && !PyCallable_Check(p->getter)) {
        Py_CLEAR(p->getter);
    }
    p->cuda = cuda != NULL && cuda != Py_None;
    /* str() of torch's version object runs its code: here, not under the
     * lock. */
    text = version == NULL ? NULL : PyObject_Str(version);
    if (text == NULL && version != NULL && !ac_clear_ordinary()) {
        goto done;
    }
    if (exact_str(text, &p->version) < 0) {
        goto done;
    }
    p->live = ac_read_live(torch);
    rc = p->live == NULL && PyErr_Occurred() ? -1 : 0;
done:
    Py_XDECREF(version);
    Py_XDECREF(cuda);
    Py_XDECREF(text);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Attaching                                                            */
/* ------------------------------------------------------------------ */

/* Decide from torch's build whether a write can do anything.  Lock held;
 * 0 or -1. */
static int
check_build_locked(ac_state *st, const probe *p)
{
    st->cpu_only = !p->cuda && p->hip == NULL;
    if (st->block != AC_OK) {
        return 0;
    }
#if defined(_WIN32) || defined(__APPLE__)
    st->block = AC_BLOCK_PLATFORM;
    return 0;
#endif
    if (p->hip != NULL) {
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

    /* Both exact str: the comparison runs no Python code. */
    if (PyUnicode_GET_LENGTH(live) == 0 || st->block == AC_BLOCK_MALFORMED ||
        PyUnicode_Compare(live, st->user_raw) == 0) {
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

/* After torch refused allocconf's configuration: windows build on what
 * it holds, if allocconf can read that.  Lock held; 0 or -1. */
static int
fall_back_locked(ac_state *st)
{
    ac_conf held = {NULL, 0, 0};
    ac_next n = AC_NEXT_INIT;
    ac_error err;
    const char *s;
    Py_ssize_t len;
    int rc;

    if (ac_conf_chars(st->in_force, &s, &len) < 0) {
        return -1;
    }
    if (ac_conf_parse(s, (size_t)len, &held, &err) < 0) {
        if (err.nomem) {
            PyErr_NoMemory();
            return -1;
        }
        st->block = AC_BLOCK_REFUSED;
        return 0;
    }
    rc = ac_next_fall_back(st, &held, &n);
    if (rc == 0) {
        ac_next_swap(st, &n);
    }
    ac_conf_clear(&held);
    ac_next_clear(&n);
    return rc;
}

/* Read the environment again when it changed between `import allocconf`
 * and `import torch` (torch reads it later), or when this torch reads
 * another variable than allocconf assumed.  Lock held; 0 or -1. */
static int
reload_if_changed_locked(ac_state *st, unsigned before, PyObject *warnings)
{
    PyObject *snap;
    int same;

    if (st->configured) {
        return 0;
    }
    snap = ac_env_snapshot();
    if (snap == NULL) {
        return -1;
    }
    same = st->env_seen != NULL &&
           PyObject_RichCompareBool(snap, st->env_seen, Py_EQ) == 1 &&
           ac_env_first(st->reads) == ac_env_first(before) &&
           ac_env_first(AC_READS_BACKEND(st->reads)) ==
               ac_env_first(AC_READS_BACKEND(before));
    Py_DECREF(snap);
    return same ? 0 : ac_load_locked(st, warnings);
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
    reads = reads_of(p, &generic);
    before = ac_env_reads_of(st);
    ac_env_set_reads_locked(st, reads, generic);
    if (reload_if_changed_locked(st, before, warnings) < 0 ||
        ac_env_opt_out_locked(st, warnings) < 0) {
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
    Py_XSETREF(st->getter, p->getter);
    p->getter = NULL;
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
    st->mask_in_force = ac_sticky_mask_str(st, st->in_force);
    st->attached = 1;
    ac_trace_locked(st, "torch imported; it holds", st->in_force);
    if (ac_sync_locked(st, "wrote") < 0) {
        p->refusal = PyErr_GetRaisedException();
        p->target = Py_NewRef(ac_target_locked(st, &mask));
        return fall_back_locked(st);
    }
    return 0;
}

/* Record torch's words about a refused write.  Lock held; 0. */
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
    probe p = PROBE_INIT;
    PyObject *warnings, *text, *ignored;

    if (probe_torch(torch, &p) < 0) {
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
        PyErr_Clear(); /* inside `import torch`: nothing may escape */
        text = PyUnicode_FromString("(its error has no text)");
    }
    else {
        Py_SETREF(text, PyUnicode_FromObject(text));
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
