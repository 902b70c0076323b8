/*
 * environ.c -- the environment: which of torch's variables is set, what
 * it says, and allocconf's own switches.  getenv only: os.environ is
 * never read or changed.
 */
#include "environ.h"
#include "config.h"
#include "errors.h"

#include <stdlib.h>
#include <string.h>

/* The variables torch reads, in the order it looks for the first set. */
static const char *const ENV_VARS[] = {
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
};

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
    const char *names[] = {ENV_VARS[0],
                           ENV_VARS[1],
                           ENV_VARS[2],
                           "ALLOCCONF_AUTO",
                           "ALLOCCONF_DEBUG",
                           "ALLOCCONF_STEP_BACK",
                           "ALLOCCONF_KEEP_FOREIGN",
                           "ALLOCCONF_EXPORT"};
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

/* Parse the variable `name` = `value`; on a malformed string, a new str
 * saying why in *detail (and a warning), else *detail NULL.  0 or -1. */
static int
parse_variable(const char *name, const char *value, ac_conf *parsed,
               PyObject **detail, PyObject *warnings)
{
    ac_error err;
    PyObject *conf;

    *detail = NULL;
    if (value == NULL ||
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
    if (ac_warn_append(
            warnings,
            PyUnicode_FromFormat("allocconf: %s is malformed: %U; allocconf "
                                 "writes nothing and leaves the allocator as "
                                 "torch will read it",
                                 name, *detail)) < 0) {
        Py_CLEAR(*detail);
        return -1;
    }
    return 0;
}

int
ac_load_locked(ac_state *st, PyObject *warnings)
{
    const char *name = NULL, *value = NULL, *backend;
    ac_conf parsed = {NULL, 0, 0};
    PyObject *raw = NULL, *snap = NULL, *detail = NULL;
    ac_block block = AC_OK;
    int valid, auto_on, debug, step_back, keep_foreign, export_env;
    size_t i;

    snap = ac_env_snapshot();
    if (snap == NULL) {
        return -1;
    }
    debug = env_flag("ALLOCCONF_DEBUG", 0, &valid);
    if (read_switch("ALLOCCONF_AUTO", 1, "import-time activation stays on",
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
    for (i = 0; i < sizeof(ENV_VARS) / sizeof(ENV_VARS[0]); i++) {
        value = getenv(ENV_VARS[i]);
        if (value != NULL) {
            name = ENV_VARS[i];
            break;
        }
    }
    if (parse_variable(name, value, &parsed, &detail, warnings) < 0) {
        goto error;
    }
    block = detail != NULL ? AC_BLOCK_MALFORMED : AC_OK;
    backend = ac_conf_get(&parsed, "backend");
    if (block == AC_OK && backend != NULL && strcmp(backend, "native") != 0) {
        detail = PyUnicode_FromFormat("backend:%s", backend);
        if (detail == NULL) {
            goto error;
        }
        block = AC_BLOCK_ASYNC;
    }
    /* Valid strings are printable ASCII, so this decode cannot fail on
     * them; a malformed one keeps its bytes visible in status(). */
    raw = PyUnicode_DecodeUTF8(value ? value : "",
                               value ? (Py_ssize_t)strlen(value) : 0,
                               "surrogateescape");
    if (raw == NULL ||
        ac_adopt_user_locked(st, &parsed, raw, auto_on, name) < 0) {
        goto error;
    }
    /* Nothing can fail from here: the state changes all at once. */
    st->block = block;
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

static int
load_traced(ac_state *st, void *arg, PyObject *warnings)
{
    int rc = ac_load_locked(st, warnings);
    (void)arg;
    ac_trace_locked(st, "read the environment; config", st->user_raw);
    return rc;
}

PyObject *
ac_load_environ(ac_state *st)
{
    return ac_with_warnings(st, load_traced, NULL);
}
