/*
 * environ.c -- the environment: which of torch's variables is set, what
 * it says, and allocconf's own switches.  getenv only: os.environ is
 * never read or changed.
 */
#include "state/environ.h"
#include "state/errors.h"
#include "state/layers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The variables torch may read for its CUDA (or ROCm) allocator, in the
 * order it looks for the first one set; which of them a given torch reads
 * is ac_env_reads().  Measured on CUDA builds with tools/torch-variables.py
 * (docs/compatibility.md): 2.6.0 and 2.9.1 read only
 * PYTORCH_CUDA_ALLOC_CONF (torch's source adds the HIP one on ROCm
 * builds; 2.9.1's generic configuration parses PYTORCH_ALLOC_CONF too, and
 * nothing of CUDA's uses it).  torch with the 2.10 setter keeps
 * expandable_segments and the keys a write resets in its generic
 * configuration, which reads all three in this order (its getter shows it
 * on 2.13.0 and 2.14.1). */
const char *const ac_env_vars[AC_N_ENV_VARS] = {
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
};

unsigned
ac_env_reads(int rocm, int generic)
{
    unsigned own = AC_READS_CUDA | (rocm ? AC_READS_HIP : 0u);

    if (generic) {
        return AC_READS_ALL | ((own | AC_READS_ALLOC) << 3);
    }
    return own | (own << 3);
}

unsigned
ac_env_reads_of(const ac_state *st)
{
    return st->reads != 0 ? st->reads : AC_READS_ALL | (AC_READS_ALL << 3);
}

int
ac_env_first(unsigned reads)
{
    int i;

    for (i = 0; i < AC_N_ENV_VARS; i++) {
        if ((reads & (1u << i)) && getenv(ac_env_vars[i]) != NULL) {
            return i;
        }
    }
    return -1;
}

/* The index of the first set variable that torch does not apply (it
 * does not read it, or it takes an earlier one that is set: `first`) and
 * whose string says expandable_segments:False, or -1: the user's opt-out,
 * which allocconf honours even where torch cannot see it. */
static int
unapplied_opt_out(int first)
{
    int i;

    for (i = 0; i < AC_N_ENV_VARS; i++) {
        const char *v = getenv(ac_env_vars[i]);
        ac_conf c = {NULL, 0, 0};
        ac_error err;
        int es;

        if (i == first || v == NULL ||
            ac_conf_parse(v, strlen(v), &c, &err) < 0) {
            continue;
        }
        es = ac_conf_es(&c);
        ac_conf_clear(&c);
        if (es == 0) {
            return i;
        }
    }
    return -1;
}

/* Set st->opt_out from the environment as the torch seen so far reads
 * it, with a warning when it names a variable now.  Returns 1 when it
 * changed, 0 when not, -1 with an exception set. */
static int
update_opt_out(ac_state *st, PyObject *warnings)
{
    unsigned reads = ac_env_reads_of(st);
    int first = ac_env_first(reads), i = unapplied_opt_out(first);
    const char *opt_out = i >= 0 ? ac_env_vars[i] : NULL;
    PyObject *why;

    if (opt_out == st->opt_out) {
        return 0;
    }
    st->opt_out = opt_out;
    if (opt_out == NULL) {
        return 1;
    }
    if (!(reads & (1u << i))) {
        why = PyUnicode_FromString("the torch imported does not read it for "
                                   "CUDA");
    }
    else {
        why = PyUnicode_FromFormat("torch applies %s, which comes before it "
                                   "in torch's order and is set (to '%s')",
                                   ac_env_vars[first],
                                   getenv(ac_env_vars[first]));
    }
    if (why == NULL ||
        ac_warn_append(warnings,
                       PyUnicode_FromFormat(
                           "allocconf: %s says expandable_segments:False, "
                           "but %U; allocconf honours it as your opt-out and "
                           "turns nothing on. Move your settings into the "
                           "variable torch applies.",
                           opt_out, why)) < 0) {
        Py_XDECREF(why);
        return -1;
    }
    Py_DECREF(why);
    return 1;
}

int
ac_env_opt_out_locked(ac_state *st, PyObject *warnings)
{
    int changed = update_opt_out(st, warnings);

    if (changed <= 0) {
        return changed;
    }
    return ac_rebuild_locked(st);
}

/* A yes/no variable: its value, or `dflt` when unset; *valid is 0 when it
 * is set to something else (empty included). */
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

/* Read allocconf's switch `name` into *out (`dflt` when unset), warning
 * with `stays` when it is set to something else.  0 or -1. */
static int
read_switch(const char *name, int dflt, const char *stays, int *out,
            PyObject *warnings)
{
    int valid;

    *out = env_flag(name, dflt, &valid);
    if (valid) {
        return 0;
    }
    return ac_warn_append(
        warnings, PyUnicode_FromFormat("allocconf: %s=%s is not one of "
                                       "0/1/true/false/yes/no/on/off; %s",
                                       name, getenv(name), stays));
}

PyObject *
ac_env_snapshot(void)
{
    const char *names[] = {ac_env_vars[0],           ac_env_vars[1],
                           ac_env_vars[2],           "ALLOCCONF_AUTO",
                           "ALLOCCONF_DEBUG",        "ALLOCCONF_STEP_BACK",
                           "ALLOCCONF_KEEP_FOREIGN", "ALLOCCONF_EXPORT"};
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

/* Fill *err (else leave its message empty) when `value` is not UTF-8:
 * torch reads such a string, but its getter cannot report it and no str
 * written to its setter can say it.  0, or -1 with an exception set
 * (MemoryError). */
static int
utf8_error(const char *value, ac_error *err)
{
    PyObject *u = PyUnicode_DecodeUTF8(value, (Py_ssize_t)strlen(value), NULL);
    PyObject *exc;
    Py_ssize_t start = 0;

    memset(err, 0, sizeof(*err));
    if (u != NULL) {
        Py_DECREF(u);
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        return -1;
    }
    exc = PyErr_GetRaisedException();
    if (PyUnicodeDecodeError_GetStart(exc, &start) < 0) {
        PyErr_Clear();
    }
    Py_DECREF(exc);
    err->offset = (size_t)start;
    snprintf(err->message, sizeof(err->message),
             "byte 0x%02x is not UTF-8: torch would read it, but cannot "
             "report it back, and allocconf cannot write it",
             (unsigned char)value[start]);
    return 0;
}

/* Parse the variable `name` = `value`; on a malformed string, a new str
 * saying why in *detail (and a warning), else *detail NULL.  `known`:
 * which variables torch reads is known (torch is imported); before that
 * the warning says that a torch may ignore the variable.  0 or -1. */
static int
parse_variable(const char *name, const char *value, int known, ac_conf *parsed,
               PyObject **detail, PyObject *warnings)
{
    ac_error err;
    PyObject *conf, *text;

    *detail = NULL;
    if (value == NULL) {
        return 0;
    }
    if (utf8_error(value, &err) < 0) {
        return -1;
    }
    if (err.message[0] == '\0' &&
        ac_conf_parse(value, strlen(value), parsed, &err) == 0) {
        return 0;
    }
    conf = PyBytes_FromString(value);
    if (conf == NULL) {
        return -1;
    }
    *detail = ac_error_message(&err, conf);
    Py_DECREF(conf);
    if (*detail == NULL) {
        return -1;
    }
    if (known || strcmp(name, ac_env_vars[0]) == 0) {
        text = PyUnicode_FromFormat("allocconf: %s is malformed: %U; "
                                    "allocconf writes nothing and leaves the "
                                    "allocator as torch will read it",
                                    name, *detail);
    }
    else { /* every torch reads the CUDA variable; not every one these */
        text = PyUnicode_FromFormat(
            "allocconf: %s is malformed: %U; allocconf writes nothing unless "
            "the torch imported does not read %s (torch before 2.10 %s)",
            name, *detail, name,
            strcmp(name, ac_env_vars[1]) == 0
                ? "reads it only on ROCm builds"
                : "reads only PYTORCH_CUDA_ALLOC_CONF");
    }
    if (ac_warn_append(warnings, text) < 0) {
        Py_CLEAR(*detail);
        return -1;
    }
    return 0;
}

/* The backend torch's CUDA allocator will use, when not native: a new
 * str "backend:NAME in VARIABLE" in *detail, else *detail NULL.  That
 * allocator reads its own variables (AC_READS_BACKEND), not always the
 * one the generic keys come from (`first`, parsed into `parsed`).  A
 * malformed string there is torch's to report.  0 or -1. */
static int
backend_of(const ac_state *st, int first, const ac_conf *parsed,
           PyObject **detail)
{
    int i = ac_env_first(AC_READS_BACKEND(ac_env_reads_of(st)));
    ac_conf other = {NULL, 0, 0};
    ac_error err;
    const char *v = i >= 0 ? getenv(ac_env_vars[i]) : NULL, *backend = NULL;
    int rc = 0;

    *detail = NULL;
    if (i >= 0 && i == first) {
        backend = ac_conf_get(parsed, "backend");
    }
    else if (v != NULL && ac_conf_parse(v, strlen(v), &other, &err) == 0) {
        backend = ac_conf_get(&other, "backend");
    }
    if (backend != NULL && strcmp(backend, "native") != 0) {
        *detail =
            PyUnicode_FromFormat("backend:%s in %s", backend, ac_env_vars[i]);
        rc = *detail == NULL ? -1 : 0;
    }
    ac_conf_clear(&other);
    return rc;
}

int
ac_load_locked(ac_state *st, PyObject *warnings)
{
    const char *name = NULL, *value = NULL;
    ac_conf parsed = {NULL, 0, 0};
    PyObject *raw = NULL, *snap = NULL, *detail = NULL;
    ac_block block = AC_OK, old_block;
    int auto_on, debug, step_back, keep_foreign, export_env, first;

    snap = ac_env_snapshot();
    if (snap == NULL) {
        return -1;
    }
    if (read_switch("ALLOCCONF_DEBUG", 0, "tracing stays off", &debug,
                    warnings) < 0 ||
        read_switch("ALLOCCONF_AUTO", 1, "import-time activation stays on",
                    &auto_on, warnings) < 0 ||
        read_switch("ALLOCCONF_STEP_BACK", 1,
                    "the default still steps back for neighbours", &step_back,
                    warnings) < 0 ||
        read_switch("ALLOCCONF_KEEP_FOREIGN", 1,
                    "writes by other components are still kept", &keep_foreign,
                    warnings) < 0 ||
        read_switch("ALLOCCONF_EXPORT", 0,
                    "allocconf does not write the variable", &export_env,
                    warnings) < 0) {
        goto error;
    }
    first = ac_env_first(ac_env_reads_of(st));
    if (first >= 0) {
        name = ac_env_vars[first];
        value = getenv(name);
    }
    /* Before adopting: the strings built there follow the opt-out. */
    if (update_opt_out(st, warnings) < 0 ||
        parse_variable(name, value, st->reads != 0, &parsed, &detail,
                       warnings) < 0) {
        goto error;
    }
    block = detail != NULL ? AC_BLOCK_MALFORMED : AC_OK;
    if (block == AC_OK && backend_of(st, first, &parsed, &detail) < 0) {
        goto error;
    }
    if (detail != NULL && block == AC_OK) {
        block = AC_BLOCK_ASYNC;
    }
    /* Valid strings are printable ASCII, so this decode cannot fail on
     * them; a malformed one keeps its bytes visible in status(). */
    raw = PyUnicode_DecodeUTF8(value ? value : "",
                               value ? (Py_ssize_t)strlen(value) : 0,
                               "surrogateescape");
    /* The block first: the strings built in adopting follow it. */
    old_block = st->block;
    st->block = block;
    if (raw == NULL ||
        ac_adopt_user_locked(st, &parsed, raw, auto_on, name) < 0) {
        st->block = old_block;
        goto error;
    }
    /* Nothing can fail from here: the state changes all at once. */
    Py_XSETREF(st->block_detail, detail);
    Py_XSETREF(st->env_raw, raw);
    Py_XSETREF(st->env_seen, snap);
    st->debug = debug;
    st->step_back = step_back;
    st->keep_foreign = keep_foreign;
    st->export_env = export_env;
    st->loaded = 1;
    return 0;

error:
    ac_conf_clear(&parsed);
    Py_XDECREF(raw);
    Py_XDECREF(snap);
    Py_XDECREF(detail);
    return -1;
}

void
ac_env_set_reads_locked(ac_state *st, unsigned reads, int generic)
{
    st->reads = reads;
    st->sticky_known = ac_sticky_known(generic);
}

typedef struct {
    unsigned reads; /* 0: not known */
    int generic;
} torch_reads;

static int
load_traced(ac_state *st, void *arg, PyObject *warnings)
{
    const torch_reads *t = arg;
    int rc;

    if (t->reads != 0) {
        ac_env_set_reads_locked(st, t->reads, t->generic);
    }
    rc = ac_load_locked(st, warnings);
    ac_trace_locked(st, "read the environment; config", st->user_raw);
    return rc;
}

PyObject *
ac_load_environ(ac_state *st, unsigned reads, int generic)
{
    torch_reads t = {reads, generic};
    return ac_with_warnings(st, load_traced, &t);
}
