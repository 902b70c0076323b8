/*
 * apply.c -- allocconf's state and every write to torch's allocator.
 *
 * The state holds the user's configuration, the three strings a write can
 * carry (the user's configuration with expandable_segments as allocconf
 * wants it, forced on, forced off), and the open windows.  A write happens
 * only when the string torch should hold differs from the one it holds,
 * always under the state lock, so the order of writes is the order of the
 * changes that caused them.  torch is never imported from here: the
 * Python side hands the module over once `import torch` has finished.
 */
#include "apply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The variables torch reads, in the order it looks for the first set. */
static const char *const ENV_VARS[] = {
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
};

/* ------------------------------------------------------------------ */
/* Lock and trace                                                       */
/* ------------------------------------------------------------------ */

int
ac_lock(ac_state *st)
{
    unsigned long me = PyThread_get_thread_ident();

    /* `owner` is written only by the thread holding the lock, and read
     * here with the GIL held, so equality with our own ident is exact. */
    if (st->owner == me) {
        PyErr_SetString(PyExc_RuntimeError,
                        "allocconf was called from inside torch's allocator "
                        "setter while it was writing; call it afterwards");
        return -1;
    }
#if PY_VERSION_HEX >= 0x030D0000
    PyMutex_Lock(&st->mutex);
#else
    if (!PyThread_acquire_lock(st->mutex, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
            PyThread_acquire_lock(st->mutex, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
#endif
    st->owner = me;
    return 0;
}

void
ac_unlock(ac_state *st)
{
    st->owner = 0;
#if PY_VERSION_HEX >= 0x030D0000
    PyMutex_Unlock(&st->mutex);
#else
    PyThread_release_lock(st->mutex);
#endif
}

/* Trace with the lock held. */
static void
trace_locked(ac_state *st, const char *what, PyObject *s)
{
    if (!st->debug) {
        return;
    }
    if (s != NULL) {
        const char *u = PyUnicode_AsUTF8(s);
        if (u == NULL) {
            PyErr_Clear();
            u = "?";
        }
        fprintf(stderr, "allocconf: %s '%s'\n", what, u);
    }
    else {
        fprintf(stderr, "allocconf: %s\n", what);
    }
    fflush(stderr);
}

void
ac_trace(ac_state *st, const char *msg)
{
    if (ac_lock(st) < 0) {
        PyErr_Clear();
        return;
    }
    trace_locked(st, msg, NULL);
    ac_unlock(st);
}

/* ------------------------------------------------------------------ */
/* Errors                                                               */
/* ------------------------------------------------------------------ */

/* The text of `conf` as char data: UTF-8 of a str, or a bytes' bytes.
 * Returns 0, or -1 with an exception set. */
static int
conf_chars(PyObject *conf, const char **s, Py_ssize_t *n)
{
    if (PyBytes_Check(conf)) {
        *s = PyBytes_AS_STRING(conf);
        *n = PyBytes_GET_SIZE(conf);
        return 0;
    }
    *s = PyUnicode_AsUTF8AndSize(conf, n);
    return *s == NULL ? -1 : 0;
}

/* A new str of s[0:n] with anything but printable ASCII as \\xNN. */
static PyObject *
escaped(const char *s, Py_ssize_t n)
{
    PyObject *r;
    char *buf = PyMem_Malloc((size_t)n * 4 + 1), *p = buf;
    Py_ssize_t i;

    if (buf == NULL) {
        return PyErr_NoMemory();
    }
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            *p++ = (char)c;
        }
        else {
            p += sprintf(p, "\\x%02x", c);
        }
    }
    r = PyUnicode_FromStringAndSize(buf, p - buf);
    PyMem_Free(buf);
    return r;
}

/* A new str: "key at offset N: message (in '...snippet...')", the
 * snippet a window of `conf` around the fault.  NULL on error. */
static PyObject *
error_message(const ac_error *err, PyObject *conf)
{
    enum { BEFORE = 30, AFTER = 30 };
    const char *s;
    Py_ssize_t n, lo, hi, off = (Py_ssize_t)err->offset;
    PyObject *snippet, *msg;

    if (conf_chars(conf, &s, &n) < 0) {
        return NULL;
    }
    if (off > n) {
        off = n;
    }
    lo = off > BEFORE ? off - BEFORE : 0;
    hi = n - off > AFTER ? off + AFTER : n;
    snippet = escaped(s + lo, hi - lo);
    if (snippet == NULL) {
        return NULL;
    }
    if (err->key[0]) {
        msg = PyUnicode_FromFormat(
            "%s at offset %zd: %s (in %s'%U'%s)", err->key, off, err->message,
            lo ? "..." : "", snippet, hi < n ? "..." : "");
    }
    else {
        msg = PyUnicode_FromFormat("offset %zd: %s (in %s'%U'%s)", off,
                                   err->message, lo ? "..." : "", snippet,
                                   hi < n ? "..." : "");
    }
    Py_DECREF(snippet);
    return msg;
}

/* Set attribute `name` of `obj` to a str of `s`, or None when s is
 * empty.  Returns 0 or -1. */
static int
set_text_attr(PyObject *obj, const char *name, const char *s)
{
    PyObject *v;
    int rc;

    if (s[0] == '\0') {
        return PyObject_SetAttrString(obj, name, Py_None);
    }
    v = PyUnicode_DecodeASCII(s, (Py_ssize_t)strlen(s), "backslashreplace");
    if (v == NULL) {
        return -1;
    }
    rc = PyObject_SetAttrString(obj, name, v);
    Py_DECREF(v);
    return rc;
}

PyObject *
ac_raise(ac_state *st, const ac_error *err, PyObject *conf)
{
    PyObject *msg = NULL, *exc = NULL, *offset = NULL, *text = NULL;

    if (err->nomem) {
        return PyErr_NoMemory();
    }
    msg = error_message(err, conf);
    if (msg == NULL) {
        goto done;
    }
    exc = PyObject_CallOneArg(st->error_type, msg);
    if (exc == NULL) {
        goto done;
    }
    offset = PyLong_FromSize_t(err->offset);
    if (PyBytes_Check(conf)) {
        text = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(conf),
                                    PyBytes_GET_SIZE(conf), "surrogateescape");
    }
    else {
        text = Py_NewRef(conf);
    }
    if (offset == NULL || text == NULL ||
        set_text_attr(exc, "key", err->key) < 0 ||
        set_text_attr(exc, "text", err->text) < 0 ||
        PyObject_SetAttrString(exc, "offset", offset) < 0 ||
        PyObject_SetAttrString(exc, "conf", text) < 0) {
        goto done;
    }
    PyErr_SetObject(st->error_type, exc);
done:
    Py_XDECREF(msg);
    Py_XDECREF(exc);
    Py_XDECREF(offset);
    Py_XDECREF(text);
    return NULL;
}

/* Raise AllocConfError with a message and no position. */
static void
raise_plain(ac_state *st, PyObject *msg)
{
    PyObject *exc;

    if (msg == NULL) {
        return;
    }
    exc = PyObject_CallOneArg(st->error_type, msg);
    Py_DECREF(msg);
    if (exc == NULL) {
        return;
    }
    if (PyObject_SetAttrString(exc, "key", Py_None) == 0 &&
        PyObject_SetAttrString(exc, "offset", Py_None) == 0 &&
        PyObject_SetAttrString(exc, "text", Py_None) == 0 &&
        PyObject_SetAttrString(exc, "conf", Py_None) == 0) {
        PyErr_SetObject(st->error_type, exc);
    }
    Py_DECREF(exc);
}

/* ------------------------------------------------------------------ */
/* The strings to write                                                 */
/* ------------------------------------------------------------------ */

typedef struct {
    PyObject *base;
    PyObject *on;
    PyObject *off;
    int base_es;
} strings;

static void
strings_clear(strings *w)
{
    Py_CLEAR(w->base);
    Py_CLEAR(w->on);
    Py_CLEAR(w->off);
}

/* expandable_segments in c: 1, 0, or -1 when not set. */
static int
conf_es(const ac_conf *c)
{
    const char *v = ac_conf_get(c, "expandable_segments");
    if (v == NULL) {
        return -1;
    }
    return strcmp(v, "True") == 0;
}

/* A new str: `user` with expandable_segments set to es (-1: as it is),
 * backend left out (torch reads it once, at load).  NULL on error. */
static PyObject *
with_es(const ac_conf *user, int es)
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
    s = ac_conf_serialise(&tmp, "backend");
    ac_conf_clear(&tmp);
    if (s == NULL) {
        return PyErr_NoMemory();
    }
    r = PyUnicode_FromString(s);
    free(s);
    return r;
}

/* Compute the three strings for `user` (held by torch as `raw`, a str).
 * The user's own expandable_segments wins; otherwise ALLOCCONF_AUTO puts
 * True in.  When nothing changes, str_base is `raw` itself, so that a
 * restore gives back exactly the string the user wrote.  0 or -1. */
static int
build_strings(const ac_conf *user, PyObject *raw, int auto_on, strings *w)
{
    int user_es = conf_es(user);
    int base_es = user_es >= 0 ? user_es : (auto_on ? 1 : -1);

    w->base_es = base_es;
    if (base_es == user_es && ac_conf_get(user, "backend") == NULL) {
        w->base = Py_NewRef(raw);
    }
    else {
        w->base = with_es(user, base_es);
    }
    if (w->base == NULL) {
        return -1;
    }
    w->on = base_es == 1 ? Py_NewRef(w->base) : with_es(user, 1);
    w->off = base_es == 0 ? Py_NewRef(w->base) : with_es(user, 0);
    if (w->on == NULL || w->off == NULL) {
        strings_clear(w);
        return -1;
    }
    return 0;
}

static void
strings_swap(ac_state *st, strings *w)
{
    PyObject *b = st->str_base, *on = st->str_on, *off = st->str_off;
    int es = st->base_es;

    st->str_base = w->base;
    st->str_on = w->on;
    st->str_off = w->off;
    st->base_es = w->base_es;
    w->base = b;
    w->on = on;
    w->off = off;
    w->base_es = es;
}

/* Make `parsed` (held by torch as `raw`) the user's configuration, from
 * `source`, with its strings built.  Lock held.  0, or -1 with an
 * exception set and nothing changed; `parsed` is consumed either way. */
static int
adopt_user_locked(ac_state *st, ac_conf *parsed, PyObject *raw, int auto_on,
                  const char *source)
{
    strings w = {NULL, NULL, NULL, -1};

    if (build_strings(parsed, raw, auto_on, &w) < 0) {
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

/* ------------------------------------------------------------------ */
/* Writing                                                              */
/* ------------------------------------------------------------------ */

/* The string torch should hold now. */
static PyObject *
target_locked(ac_state *st)
{
    if (st->n_off > 0) {
        return st->str_off;
    }
    if (st->n_on > 0) {
        return st->str_on;
    }
    return st->str_base;
}

/* Bring torch to the target string if it holds another.  Returns 0, or
 * -1 with torch's exception set and nothing recorded as written. */
static int
sync_locked(ac_state *st, const char *why)
{
    PyObject *target = target_locked(st), *r;

    if (!st->attached || st->block != AC_OK || st->setter == NULL ||
        target == NULL) {
        return 0;
    }
    if (target == st->in_force) {
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
    r = PyObject_CallOneArg(st->setter, target);
    if (r == NULL) {
        /* torch parses in stages and keeps what it read before refusing:
         * hand it back the string it held, keep the first error. */
        if (st->in_force != NULL) {
            PyObject *exc = PyErr_GetRaisedException();
            PyObject *back = PyObject_CallOneArg(st->setter, st->in_force);
            if (back == NULL) {
                PyErr_Clear();
            }
            Py_XDECREF(back);
            PyErr_SetRaisedException(exc);
        }
        return -1;
    }
    Py_DECREF(r);
    Py_XSETREF(st->in_force, Py_NewRef(target));
    st->writes++;
    trace_locked(st, why, target);
    return 0;
}

/* ------------------------------------------------------------------ */
/* The environment                                                      */
/* ------------------------------------------------------------------ */

static int
env_flag(const char *name, int dflt, int *valid)
{
    const char *v = getenv(name);
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    size_t i;

    *valid = 1;
    if (v == NULL) {
        return dflt;
    }
    if (v[0] == '\0') { /* set but empty: a mistake worth a warning */
        *valid = 0;
        return dflt;
    }
    for (i = 0; i < 4; i++) {
        if (PyOS_stricmp(v, yes[i]) == 0) {
            return 1;
        }
        if (PyOS_stricmp(v, no[i]) == 0) {
            return 0;
        }
    }
    *valid = 0;
    return dflt;
}

/* A new tuple of the variables allocconf reads (None where unset). */
static PyObject *
env_snapshot(void)
{
    const char *names[] = {ENV_VARS[0], ENV_VARS[1], ENV_VARS[2],
                           "ALLOCCONF_AUTO", "ALLOCCONF_DEBUG"};
    enum { N = sizeof(names) / sizeof(names[0]) };
    PyObject *t = PyTuple_New(N);
    size_t i;

    if (t == NULL) {
        return NULL;
    }
    for (i = 0; i < N; i++) {
        const char *v = getenv(names[i]);
        PyObject *b = v ? PyBytes_FromString(v) : Py_NewRef(Py_None);
        if (b == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, b);
    }
    return t;
}

/* Append the str `fmt % ...` to the list `warnings`; 0 or -1. */
static int
warn_append(PyObject *warnings, PyObject *text)
{
    int rc;
    if (text == NULL) {
        return -1;
    }
    rc = PyList_Append(warnings, text);
    Py_DECREF(text);
    return rc;
}

/* Read the environment into the state (lock held).  Returns 0, or -1
 * with an exception set; problems with the user's strings become
 * warnings in `warnings`, never exceptions. */
static int
load_locked(ac_state *st, PyObject *warnings)
{
    const char *name = NULL, *value = NULL;
    ac_conf parsed = {NULL, 0, 0};
    ac_error err;
    PyObject *raw = NULL, *snap = NULL;
    int valid, auto_on, debug;
    size_t i;

    snap = env_snapshot();
    if (snap == NULL) {
        return -1;
    }
    debug = env_flag("ALLOCCONF_DEBUG", 0, &valid);
    auto_on = env_flag("ALLOCCONF_AUTO", 1, &valid);
    if (!valid &&
        warn_append(warnings, PyUnicode_FromFormat(
                                  "allocconf: ALLOCCONF_AUTO=%s is not one of "
                                  "0/1/true/false/yes/no/on/off; "
                                  "import-time activation stays on",
                                  getenv("ALLOCCONF_AUTO"))) < 0) {
        goto error;
    }
    for (i = 0; i < sizeof(ENV_VARS) / sizeof(ENV_VARS[0]); i++) {
        value = getenv(ENV_VARS[i]);
        if (value != NULL) {
            name = ENV_VARS[i];
            break;
        }
    }

    Py_CLEAR(st->block_detail);
    st->block = AC_OK;
    if (value != NULL &&
        ac_conf_parse(value, strlen(value), &parsed, &err) < 0) {
        PyObject *conf = PyBytes_FromString(value), *msg;
        if (conf == NULL) {
            goto error;
        }
        if (err.nomem) {
            Py_DECREF(conf);
            PyErr_NoMemory();
            goto error;
        }
        msg = error_message(&err, conf);
        Py_DECREF(conf);
        if (msg == NULL) {
            goto error;
        }
        st->block = AC_BLOCK_MALFORMED;
        st->block_detail = msg;
        if (warn_append(warnings,
                        PyUnicode_FromFormat(
                            "allocconf: %s is malformed: %U; allocconf "
                            "writes nothing and leaves the allocator as "
                            "torch will read it",
                            name, msg)) < 0) {
            goto error;
        }
    }
    /* Valid strings are printable ASCII, so this decode cannot fail on
     * them; a malformed one keeps its bytes visible in status(). */
    raw = PyUnicode_DecodeUTF8(value ? value : "",
                               value ? (Py_ssize_t)strlen(value) : 0,
                               "surrogateescape");
    if (raw == NULL ||
        adopt_user_locked(st, &parsed, raw, auto_on, name) < 0) {
        goto error;
    }
    Py_XSETREF(st->env_raw, raw);
    Py_XSETREF(st->env_seen, snap);
    st->debug = debug;
    st->loaded = 1;
    {
        const char *b = ac_conf_get(&st->user, "backend");
        if (st->block == AC_OK && b != NULL && strcmp(b, "native") != 0) {
            st->block = AC_BLOCK_ASYNC;
            st->block_detail = PyUnicode_FromFormat("backend:%s", b);
            if (st->block_detail == NULL) {
                return -1;
            }
        }
    }
    return 0;

error:
    ac_conf_clear(&parsed);
    Py_XDECREF(raw);
    Py_XDECREF(snap);
    return -1;
}

PyObject *
ac_load_environ(ac_state *st)
{
    PyObject *warnings = PyList_New(0);
    int rc;

    if (warnings == NULL || ac_lock(st) < 0) {
        Py_XDECREF(warnings);
        return NULL;
    }
    rc = load_locked(st, warnings);
    trace_locked(st, "read the environment; config", st->user_raw);
    ac_unlock(st);
    if (rc < 0) {
        Py_DECREF(warnings);
        return NULL;
    }
    return warnings;
}

/* ------------------------------------------------------------------ */
/* Attaching to torch                                                   */
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

/* Adopt the live string as the user's configuration when the user set one
 * through torch before allocconf saw it.  Lock held; 0 or -1. */
static int
adopt_live_locked(ac_state *st, PyObject *live, PyObject *warnings)
{
    ac_conf parsed = {NULL, 0, 0};
    ac_error err;
    const char *s;
    Py_ssize_t n;
    int same = PyUnicode_Compare(live, st->user_raw);

    if (same == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (same == 0 || PyUnicode_GET_LENGTH(live) == 0 ||
        st->block == AC_BLOCK_MALFORMED) {
        return 0;
    }
    if (conf_chars(live, &s, &n) < 0) {
        return -1;
    }
    if (ac_conf_parse(s, (size_t)n, &parsed, &err) < 0) {
        PyObject *msg;
        if (err.nomem) {
            PyErr_NoMemory();
            return -1;
        }
        msg = error_message(&err, live);
        return warn_append(
            warnings,
            msg == NULL ? NULL
                        : PyUnicode_FromFormat(
                              "allocconf: torch holds a "
                              "configuration allocconf "
                              "cannot read (%U); using %s",
                              msg, st->source ? st->source : "the defaults"));
    }
    return adopt_user_locked(st, &parsed, live, st->auto_on, "torch");
}

/* Find torch's setter, by capability.  Lock held; 0 or -1. */
static int
resolve_setter_locked(ac_state *st, PyObject *torch)
{
    static const struct {
        const char *path;
        const char *api;
    } candidates[] = {
        {"_C._accelerator_setAllocatorSettings",
         "torch._C._accelerator_setAllocatorSettings"},
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
            PyObject *api = PyUnicode_FromString(candidates[i].api);
            if (api == NULL) {
                Py_DECREF(f);
                return -1;
            }
            Py_XSETREF(st->setter, f);
            Py_XSETREF(st->api, api);
            return 0;
        }
        Py_XDECREF(f);
    }
    return 0;
}

/* Decide from torch's build whether a write can do anything.  Lock held;
 * 0 or -1. */
static int
check_build_locked(ac_state *st, PyObject *torch)
{
    PyObject *cuda = lookup(torch, "version.cuda");
    PyObject *hip = lookup(torch, "version.hip");
    int rc = 0;

    st->cpu_only =
        (cuda == NULL || cuda == Py_None) && (hip == NULL || hip == Py_None);
    if (st->block != AC_OK) {
        goto done;
    }
#if defined(_WIN32) || defined(__APPLE__)
    st->block = AC_BLOCK_PLATFORM;
    goto done;
#endif
    if (hip != NULL && PyUnicode_Check(hip)) {
        const char *v = PyUnicode_AsUTF8(hip);
        if (v == NULL) {
            rc = -1;
            goto done;
        }
        if (atoi(v) < 7) {
            st->block = AC_BLOCK_ROCM;
            st->block_detail = PyUnicode_FromString(v);
            rc = st->block_detail == NULL ? -1 : 0;
            goto done;
        }
    }
    if (st->setter == NULL) {
        st->block = AC_BLOCK_NO_SETTER;
    }
done:
    Py_XDECREF(cuda);
    Py_XDECREF(hip);
    return rc;
}

/* Attach with the lock held.  0 or -1. */
static int
attach_locked(ac_state *st, PyObject *torch, PyObject *warnings)
{
    PyObject *live;

    if (!st->configured) {
        /* The user may have changed the environment between
         * `import allocconf` and `import torch`: torch reads it later. */
        PyObject *snap = env_snapshot();
        int same;
        if (snap == NULL) {
            return -1;
        }
        same = st->env_seen != NULL &&
               PyObject_RichCompareBool(snap, st->env_seen, Py_EQ) == 1;
        Py_DECREF(snap);
        if (!same && load_locked(st, warnings) < 0) {
            return -1;
        }
    }
    if (resolve_setter_locked(st, torch) < 0 ||
        check_build_locked(st, torch) < 0) {
        return -1;
    }
    Py_XSETREF(st->torch_version, lookup(torch, "__version__"));
    live = ac_read_live(torch);
    if (live != NULL && !st->configured &&
        adopt_live_locked(st, live, warnings) < 0) {
        Py_DECREF(live);
        return -1;
    }
    /* What torch holds: the live string, else the variable it will read
     * (not a configure() result: that is not written yet). */
    Py_XSETREF(st->in_force, live != NULL ? live : Py_NewRef(st->env_raw));
    st->attached = 1;
    trace_locked(st, "torch imported; it holds", st->in_force);
    if (sync_locked(st, "wrote") < 0) {
        /* Torch refused: say so, leave the allocator as it was. */
        PyObject *exc = PyErr_GetRaisedException();
        PyObject *r =
            PyUnicode_FromFormat("allocconf: torch rejected '%U': %S; "
                                 "the allocator was left as it was",
                                 target_locked(st), exc);
        Py_XDECREF(exc);
        return warn_append(warnings, r);
    }
    return 0;
}

PyObject *
ac_attach(ac_state *st, PyObject *torch)
{
    PyObject *warnings = PyList_New(0);
    int rc = 0;

    if (warnings == NULL || ac_lock(st) < 0) {
        Py_XDECREF(warnings);
        return NULL;
    }
    if (!st->attached) {
        rc = attach_locked(st, torch, warnings);
    }
    ac_unlock(st);
    if (rc < 0) {
        Py_DECREF(warnings);
        return NULL;
    }
    return warnings;
}

/* ------------------------------------------------------------------ */
/* configure() and overrides                                            */
/* ------------------------------------------------------------------ */

/* Append the text of one list element (a scalar, or a (k, v) pair) to
 * the list `parts`.  0 or -1. */
static int
list_item_text(PyObject *parts, PyObject *k, PyObject *v)
{
    PyObject *ks = NULL, *vs = NULL, *item = NULL;
    int rc = -1;

    ks = PyUnicode_Check(k) ? Py_NewRef(k) : PyObject_Str(k);
    if (ks == NULL) {
        goto done;
    }
    if (v != NULL) {
        vs = PyUnicode_Check(v) ? Py_NewRef(v) : PyObject_Str(v);
        if (vs == NULL) {
            goto done;
        }
        item = PyUnicode_FromFormat("%U:%U", ks, vs);
    }
    else {
        item = Py_NewRef(ks);
    }
    if (item != NULL) {
        rc = PyList_Append(parts, item);
    }
done:
    Py_XDECREF(ks);
    Py_XDECREF(vs);
    Py_XDECREF(item);
    return rc;
}

/* A new str "[a:b,c:d]" from a dict or a sequence of pairs, or NULL. */
static PyObject *
list_text(PyObject *value)
{
    PyObject *parts = PyList_New(0), *seq = NULL, *sep = NULL, *joined;
    PyObject *r = NULL;
    Py_ssize_t i;

    if (parts == NULL) {
        return NULL;
    }
    if (PyDict_Check(value)) {
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(value, &pos, &k, &v)) {
            if (list_item_text(parts, k, v) < 0) {
                goto done;
            }
        }
    }
    else {
        seq = PySequence_Fast(value, "a list value must be a sequence");
        if (seq == NULL) {
            goto done;
        }
        for (i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
            PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
            int rc;
            if (PyTuple_Check(it) && PyTuple_GET_SIZE(it) == 2) {
                rc = list_item_text(parts, PyTuple_GET_ITEM(it, 0),
                                    PyTuple_GET_ITEM(it, 1));
            }
            else {
                rc = list_item_text(parts, it, NULL);
            }
            if (rc < 0) {
                goto done;
            }
        }
    }
    sep = PyUnicode_FromString(",");
    if (sep == NULL) {
        goto done;
    }
    joined = PyUnicode_Join(sep, parts);
    if (joined != NULL) {
        r = PyUnicode_FromFormat("[%U]", joined);
        Py_DECREF(joined);
    }
done:
    Py_DECREF(parts);
    Py_XDECREF(seq);
    Py_XDECREF(sep);
    return r;
}

PyObject *
ac_override_text(ac_state *st, const char *key, PyObject *value)
{
    PyObject *text;
    ac_error err;
    char *norm = NULL;
    const char *s;

    if (value == Py_None) {
        return Py_NewRef(Py_None);
    }
    if (PyBool_Check(value)) {
        text = PyUnicode_FromString(value == Py_True ? "True" : "False");
    }
    else if (PyUnicode_Check(value)) {
        text = Py_NewRef(value);
    }
    else if (PyLong_Check(value)) {
        text = PyObject_Str(value);
    }
    else if (PyFloat_Check(value)) {
        text = PyObject_Repr(value);
    }
    else if (PyDict_Check(value) || PyList_Check(value) ||
             PyTuple_Check(value)) {
        text = list_text(value);
    }
    else {
        return PyErr_Format(PyExc_TypeError,
                            "allocconf: %s: a value must be a str, bool, "
                            "int, float, dict or list, not %.100s",
                            key, Py_TYPE(value)->tp_name);
    }
    if (text == NULL) {
        return NULL;
    }
    s = PyUnicode_AsUTF8(text);
    if (s == NULL) {
        Py_DECREF(text);
        return NULL;
    }
    if (ac_value_parse(key, s, &norm, &err) < 0) {
        /* Report it as "key:value" so the offset points into that. */
        PyObject *conf = PyUnicode_FromFormat("%s:%U", key, text);
        Py_DECREF(text);
        if (conf == NULL) {
            return NULL;
        }
        err.offset += strlen(key) + 1;
        if (err.key[0] == '\0') {
            snprintf(err.key, sizeof(err.key), "%s", key);
        }
        ac_raise(st, &err, conf);
        Py_DECREF(conf);
        return NULL;
    }
    Py_DECREF(text);
    text = PyUnicode_FromString(norm);
    free(norm);
    return text;
}

int
ac_apply_overrides(ac_state *st, ac_conf *c, PyObject *overrides)
{
    PyObject *k, *v;
    Py_ssize_t pos = 0;

    while (PyDict_Next(overrides, &pos, &k, &v)) {
        const char *key = PyUnicode_AsUTF8(k);
        PyObject *text;
        int rc;

        if (key == NULL) {
            return -1;
        }
        text = ac_override_text(st, key, v);
        if (text == NULL) {
            return -1;
        }
        if (text == Py_None) {
            rc = ac_conf_set(c, key, NULL);
        }
        else {
            const char *t = PyUnicode_AsUTF8(text);
            rc = t == NULL ? -1 : ac_conf_set(c, key, t);
            if (t == NULL) {
                Py_DECREF(text);
                return -1;
            }
        }
        Py_DECREF(text);
        if (rc < 0) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
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

/* Merge conf and overrides into a copy of the user's configuration.
 * Lock held.  0 or -1 (out left empty). */
static int
merged_locked(ac_state *st, PyObject *conf, PyObject *overrides, ac_conf *out)
{
    ac_conf add = {NULL, 0, 0};
    ac_error err;
    const char *s, *old_b, *new_b;
    Py_ssize_t n;
    size_t i;

    if (ac_conf_copy(out, &st->user) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    if (conf != NULL) {
        if (conf_chars(conf, &s, &n) < 0) {
            goto error;
        }
        if (ac_conf_parse(s, (size_t)n, &add, &err) < 0) {
            ac_raise(st, &err, conf);
            goto error;
        }
        for (i = 0; i < add.len; i++) {
            if (ac_conf_set(out, add.items[i].key, add.items[i].value) < 0) {
                PyErr_NoMemory();
                goto error;
            }
        }
        ac_conf_clear(&add);
    }
    if (overrides != NULL && ac_apply_overrides(st, out, overrides) < 0) {
        goto error;
    }
    old_b = ac_conf_get(&st->user, "backend");
    new_b = ac_conf_get(out, "backend");
    if (strcmp(old_b ? old_b : "native", new_b ? new_b : "native") != 0) {
        raise_plain(st,
                    PyUnicode_FromFormat(
                        "backend: torch reads it once, when it loads "
                        "(here: %s); it cannot become '%s' at run time",
                        old_b ? old_b : "native", new_b ? new_b : "native"));
        goto error;
    }
    return 0;

error:
    ac_conf_clear(&add);
    ac_conf_clear(out);
    return -1;
}

PyObject *
ac_configure(ac_state *st, PyObject *conf, PyObject *overrides)
{
    ac_conf merged = {NULL, 0, 0}, old_user;
    strings w = {NULL, NULL, NULL, -1};
    PyObject *raw = NULL, *old_raw, *result = NULL;
    int old_configured;

    if (ac_lock(st) < 0) {
        return NULL;
    }
    if (!st->loaded) {
        /* Only reached when _C is used without the package's __init__. */
        PyObject *ignored = PyList_New(0);
        int rc = ignored == NULL ? -1 : load_locked(st, ignored);
        Py_XDECREF(ignored);
        if (rc < 0) {
            goto done;
        }
    }
    if (st->block == AC_BLOCK_MALFORMED) {
        raise_plain(st, PyUnicode_FromFormat(
                            "allocconf: %s is malformed (%U); fix it before "
                            "configure() can merge into it",
                            st->source, st->block_detail));
        goto done;
    }
    if (merged_locked(st, conf, overrides, &merged) < 0) {
        goto done;
    }
    raw = ac_checked_string(st, &merged, "backend");
    if (raw == NULL || build_strings(&merged, raw, st->auto_on, &w) < 0) {
        goto done;
    }
    /* Commit, write, and roll back if torch refuses. */
    old_user = st->user;
    old_raw = st->user_raw;
    old_configured = st->configured;
    st->user = merged;
    st->user_raw = raw;
    st->configured = 1;
    strings_swap(st, &w);
    if (sync_locked(st, "configure() wrote") < 0) {
        st->user = old_user;
        st->user_raw = old_raw;
        st->configured = old_configured;
        strings_swap(st, &w);
        goto done; /* merged and raw are freed below */
    }
    ac_conf_clear(&old_user);
    Py_XDECREF(old_raw);
    merged = (ac_conf){NULL, 0, 0};
    raw = NULL;
    result = Py_NewRef(st->str_base);
done:
    ac_unlock(st);
    ac_conf_clear(&merged);
    Py_XDECREF(raw);
    strings_clear(&w);
    return result;
}

/* ------------------------------------------------------------------ */
/* Windows                                                              */
/* ------------------------------------------------------------------ */

int
ac_window(ac_state *st, int enabled, int enter)
{
    Py_ssize_t *n;

    if (ac_lock(st) < 0) {
        return -1;
    }
    n = enabled ? &st->n_on : &st->n_off;
    if (enter) {
        (*n)++;
        if (sync_locked(st, enabled ? "window on" : "window off") < 0) {
            (*n)--;
            goto error;
        }
    }
    else {
        if (*n == 0) {
            PyErr_Format(PyExc_RuntimeError,
                         "allocconf: an expandable_segments(%s) window was "
                         "closed more often than it was opened",
                         enabled ? "True" : "False");
            goto error;
        }
        (*n)--;
        if (sync_locked(st, "window closed") < 0) {
            goto error;
        }
    }
    ac_unlock(st);
    return 0;
error:
    ac_unlock(st);
    return -1;
}

/* ------------------------------------------------------------------ */
/* status()                                                             */
/* ------------------------------------------------------------------ */

/* A new str saying why expandable segments are or are not on. */
static PyObject *
reason_locked(ac_state *st)
{
    const char *src = st->source ? st->source : "the environment";
    int user_es = conf_es(&st->user);

    switch (st->block) {
    case AC_BLOCK_MALFORMED:
        return PyUnicode_FromFormat("%s is malformed (%U); allocconf writes "
                                    "nothing",
                                    src, st->block_detail);
    case AC_BLOCK_ASYNC:
        return PyUnicode_FromFormat(
            "%U in %s: that backend has no expandable segments; allocconf "
            "writes nothing",
            st->block_detail, src);
    case AC_BLOCK_PLATFORM:
        return PyUnicode_FromString(
            "expandable segments are not supported on this platform "
            "(Windows or macOS); allocconf writes nothing");
    case AC_BLOCK_ROCM:
        return PyUnicode_FromFormat(
            "ROCm %U: expandable segments need ROCm 7 or newer; allocconf "
            "writes nothing",
            st->block_detail);
    case AC_BLOCK_NO_SETTER:
        return PyUnicode_FromFormat(
            "torch %S has no run-time allocator setter; allocconf writes "
            "nothing",
            st->torch_version ? st->torch_version : Py_None);
    case AC_OK:
        break;
    }
    if (st->n_off > 0) {
        return PyUnicode_FromFormat(
            "%zd ipc_safe() window(s) open: expandable segments held off",
            st->n_off);
    }
    if (st->n_on > 0) {
        return PyUnicode_FromFormat(
            "%zd expandable_segments(True) window(s) open: held on", st->n_on);
    }
    if (st->configured) {
        return PyUnicode_FromFormat(
            "configured by allocconf.configure(): expandable_segments %s%s",
            st->base_es == 1 ? "on" : "off",
            st->attached ? ""
                         : " (torch not imported yet; written when it is)");
    }
    if (user_es >= 0) {
        return PyUnicode_FromFormat(
            "expandable_segments:%s set by the user in %s; allocconf keeps "
            "it",
            user_es ? "True" : "False", src);
    }
    if (!st->auto_on) {
        return PyUnicode_FromString(
            "ALLOCCONF_AUTO=0: no import-time change; windows still work");
    }
    if (!st->attached) {
        return PyUnicode_FromString(
            "torch not imported yet: allocconf turns expandable segments "
            "on when it is");
    }
    if (st->cpu_only) {
        return PyUnicode_FromString(
            "expandable segments turned on by allocconf; this torch is a "
            "CPU-only build, so no device will use them");
    }
    return PyUnicode_FromString("expandable segments turned on by "
                                "allocconf");
}

/* A new tuple of advice about the configuration in force (str each). */
static PyObject *
advice_locked(ac_state *st)
{
    PyObject *list = PyList_New(0);

    if (list != NULL && st->block == AC_OK && st->base_es == 1 &&
        conf_es(&st->user) < 0 &&
        ac_conf_get(&st->user, "max_split_size_mb") != NULL) {
        PyObject *a = PyUnicode_FromFormat(
            "max_split_size_mb is set (in %s) and allocconf turns "
            "expandable segments on: together they can make torch reserve "
            "many times the memory in use (see allocconf's "
            "docs/troubleshooting.md). Drop max_split_size_mb, or set "
            "expandable_segments yourself to silence this.",
            st->source ? st->source : "configure()");
        if (a == NULL || PyList_Append(list, a) < 0) {
            Py_CLEAR(list);
        }
        Py_XDECREF(a);
    }
    /* A tuple, so that the frozen Status built from it is hashable. */
    if (list != NULL) {
        Py_SETREF(list, PyList_AsTuple(list));
    }
    return list;
}

int
ac_init_keys(ac_state *st)
{
#define AC_NAME_FIELD(name, text) text,
    static const char *const names[AC_NKEYS] = {
        AC_STATUS_FIELDS(AC_NAME_FIELD)};
#undef AC_NAME_FIELD
    size_t i;

    for (i = 0; i < AC_NKEYS; i++) {
        st->status_keys[i] = PyUnicode_InternFromString(names[i]);
        if (st->status_keys[i] == NULL) {
            return -1;
        }
    }
    return 0;
}

PyObject *
ac_status(ac_state *st)
{
    PyObject *d = NULL, *reason = NULL, *es, *config, *r = NULL;
    int ok;

    if (ac_lock(st) < 0) {
        return NULL;
    }
    reason = reason_locked(st);
    d = PyDict_New();
    if (reason == NULL || d == NULL) {
        goto done;
    }
    if (st->block != AC_OK) {
        es = Py_None;
        config = st->user_raw;
    }
    else {
        PyObject *t = target_locked(st);
        es = st->n_off > 0      ? Py_False
             : st->n_on > 0     ? Py_True
             : st->base_es == 1 ? Py_True
                                : Py_False;
        config = t;
    }
    {
        PyObject *src =
            st->source ? PyUnicode_FromString(st->source) : Py_NewRef(Py_None);
        PyObject *depth = PyLong_FromSsize_t(st->n_off + st->n_on);
        PyObject *advice = advice_locked(st);
        PyObject *values[AC_NKEYS];
        size_t i;

        values[AC_KEY_APPLIED] =
            (st->attached && st->block == AC_OK && st->writes > 0) ? Py_True
                                                                   : Py_False;
        values[AC_KEY_REASON] = reason;
        values[AC_KEY_EXPANDABLE] = es;
        values[AC_KEY_CONFIG] = config ? config : Py_None;
        values[AC_KEY_SOURCE] = src;
        values[AC_KEY_API] = st->api ? st->api : Py_None;
        values[AC_KEY_TORCH_IMPORTED] = st->attached ? Py_True : Py_False;
        values[AC_KEY_WINDOW_DEPTH] = depth;
        values[AC_KEY_USER_CONFIG] = st->user_raw ? st->user_raw : Py_None;
        values[AC_KEY_ADVICE] = advice;
        ok = src != NULL && depth != NULL && advice != NULL;
        for (i = 0; ok && i < AC_NKEYS; i++) {
            ok = PyDict_SetItem(d, st->status_keys[i], values[i]) == 0;
        }
        Py_XDECREF(src);
        Py_XDECREF(depth);
        Py_XDECREF(advice);
    }
    if (ok) {
        r = Py_NewRef(d);
    }
done:
    ac_unlock(st);
    Py_XDECREF(reason);
    Py_XDECREF(d);
    return r;
}
