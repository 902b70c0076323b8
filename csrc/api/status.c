/*
 * status.c -- status(): the configuration torch holds (or will), whether
 * expandable segments are on in it, and a sentence saying why, all read
 * under the lock from the state, so they agree with each other.
 */
#include "api/status.h"
#include "api/scoped.h"
#include "driver/alloc.h"
#include "state/environ.h"
#include "state/layers.h"
#include "torchio/torch.h"

#include <string.h>

/* A new str saying why expandable segments are or are not on. */
static PyObject *
reason_locked(ac_state *st)
{
    const char *src = st->source ? st->source : "the environment";
    int user_es = ac_conf_es(&st->user);

    switch (st->block) {
    case AC_BLOCK_MALFORMED:
        return PyUnicode_FromFormat("%s is malformed (%V); allocconf writes "
                                    "nothing",
                                    src, st->block_detail, "?");
    case AC_BLOCK_ASYNC:
        return PyUnicode_FromFormat(
            "%V: that backend has no expandable segments; allocconf turns "
            "nothing on and writes only what configure() or another "
            "component gives it",
            st->block_detail, "backend");
    case AC_BLOCK_PLATFORM:
        return PyUnicode_FromString(
            "expandable segments are not supported on this platform "
            "(Windows or macOS); allocconf writes nothing");
    case AC_BLOCK_ROCM:
        return PyUnicode_FromFormat(
            "ROCm %V: expandable segments need ROCm 7 or newer; allocconf "
            "writes nothing",
            st->block_detail, "?");
    case AC_BLOCK_NO_SETTER:
        return PyUnicode_FromFormat(
            "torch %S has no run-time allocator setter; allocconf writes "
            "nothing",
            st->torch_version ? st->torch_version : Py_None);
    case AC_BLOCK_REFUSED:
        return PyUnicode_FromFormat(
            "torch refused allocconf's configuration (%V) and holds one "
            "allocconf cannot read; allocconf writes nothing",
            st->refused, "?");
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
    if (st->refused != NULL) {
        return PyUnicode_FromFormat(
            "torch refused allocconf's configuration (%U); it keeps '%V' "
            "(expandable segments %s), and windows build on that",
            st->refused, st->str_base, "?", st->base_es == 1 ? "on" : "off");
    }
    if (st->stepped_back != NULL && user_es < 0) {
        return PyUnicode_FromFormat(
            "allocconf's default stepped back for %U (%V): expandable "
            "segments off for new memory; set expandable_segments yourself, "
            "or ALLOCCONF_STEP_BACK=0, to keep them on",
            st->stepped_back,
            PyDict_GetItemWithError(st->neighbours, st->stepped_back), "?");
    }
    if (st->writer != NULL) {
        return PyUnicode_FromFormat(
            "configured by %S: expandable_segments %s%s",
            st->writer ? st->writer : Py_None, st->base_es == 1 ? "on" : "off",
            st->attached ? ""
                         : " (torch not imported yet; written when it is)");
    }
    if (user_es >= 0) {
        return PyUnicode_FromFormat(
            "expandable_segments:%s set by the user in %s; allocconf keeps "
            "it",
            user_es ? "True" : "False", src);
    }
    if (st->opt_out != NULL) {
        return PyUnicode_FromFormat(
            "expandable_segments:False set by the user in %s, which this "
            "torch does not read for CUDA: allocconf honours it as an "
            "opt-out and turns nothing on",
            st->opt_out);
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

/* A new tuple of the names of the variables in `reads`, in torch's order. */
static PyObject *
names_of(unsigned reads)
{
    PyObject *t = PyTuple_New(0);
    int i;

    for (i = 0; t != NULL && i < AC_N_ENV_VARS; i++) {
        if (reads & (1u << i)) {
            PyObject *n = Py_BuildValue("(s)", ac_env_vars[i]);
            PyObject *joined = n ? PySequence_Concat(t, n) : NULL;
            Py_XDECREF(n);
            Py_SETREF(t, joined);
        }
    }
    return t;
}

/* Append to `list` a line for each variable set when the environment was
 * last read that this torch does not apply: it does not read it, or it
 * takes an earlier one that is set, holding another string.  Its
 * settings apply nowhere.  0 or -1. */
static int
unapplied_advice_locked(ac_state *st, PyObject *list)
{
    PyObject *read, *sep, *text;
    int i, first = -1, rc = 0;

    if (st->reads == 0 || st->env_seen == NULL ||
        PyTuple_GET_SIZE(st->env_seen) < AC_N_ENV_VARS) {
        return 0; /* torch not seen yet: it may read any of them */
    }
    for (i = AC_N_ENV_VARS - 1; i >= 0; i--) {
        if ((st->reads & (1u << i)) &&
            PyBytes_Check(PyTuple_GET_ITEM(st->env_seen, i))) {
            first = i;
        }
    }
    read = names_of(st->reads);
    sep = PyUnicode_FromString(", then ");
    text = read && sep ? PyUnicode_Join(sep, read) : NULL;
    for (i = 0; text != NULL && rc == 0 && i < AC_N_ENV_VARS; i++) {
        PyObject *v = PyTuple_GET_ITEM(st->env_seen, i), *a;
        const char *honoured =
            st->opt_out == ac_env_vars[i]
                ? "; its expandable_segments:False is honoured as an opt-out"
                : "";
        /* One holding the very string torch applies loses nothing
         * (child_env() writes every variable set alike). */
        if (i == first || !PyBytes_Check(v) ||
            (first >= 0 &&
             strcmp(PyBytes_AS_STRING(v), PyBytes_AS_STRING(PyTuple_GET_ITEM(
                                              st->env_seen, first))) == 0)) {
            continue;
        }
        if (!(st->reads & (1u << i))) {
            a = PyUnicode_FromFormat(
                "%s is set ('%s') but torch %S does not read it for CUDA (it "
                "reads %U), so allocconf does not apply it either%s. Move "
                "the settings to PYTORCH_CUDA_ALLOC_CONF.",
                ac_env_vars[i], PyBytes_AS_STRING(v),
                st->torch_version ? st->torch_version : Py_None, text,
                honoured);
        }
        else {
            a = PyUnicode_FromFormat(
                "%s is set ('%s') but torch applies %s, which comes before "
                "it in torch's order (%U) and is set, so allocconf does not "
                "apply it either%s. Keep one of the two.",
                ac_env_vars[i], PyBytes_AS_STRING(v), ac_env_vars[first], text,
                honoured);
        }
        rc = a == NULL ? -1 : PyList_Append(list, a);
        Py_XDECREF(a);
    }
    if (text == NULL) {
        rc = -1;
    }
    Py_XDECREF(read);
    Py_XDECREF(sep);
    Py_XDECREF(text);
    return rc;
}

/* A new tuple of advice about the configuration in force (str each). */
static PyObject *
advice_locked(ac_state *st)
{
    PyObject *list = PyList_New(0);

    if (list != NULL && unapplied_advice_locked(st, list) < 0) {
        Py_CLEAR(list);
    }

    if (list != NULL && st->block == AC_OK && st->refused == NULL &&
        st->base_es == 1 && ac_layers_es(st) < 0 &&
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
    /* A neighbour living with expandable segments because someone chose
     * them: say what that does to it. */
    if (list != NULL && st->block == AC_OK && st->base_es == 1) {
        Py_ssize_t pos = 0;
        PyObject *name, *why;
        while (list != NULL &&
               PyDict_Next(st->neighbours, &pos, &name, &why)) {
            PyObject *a = PyUnicode_FromFormat(
                "%U is in this process and expandable segments are on (%s): "
                "%U. Hold them off around its work with allocconf.ipc_safe() "
                "or expandable_segments(False) windows.",
                name,
                !st->step_back ? "ALLOCCONF_STEP_BACK=0"
                : st->writer   ? "set at run time"
                               : "set by the user",
                why);
            if (a == NULL || PyList_Append(list, a) < 0) {
                Py_CLEAR(list);
            }
            Py_XDECREF(a);
        }
    }
    /* A tuple, so that the frozen Status built from it is hashable. */
    if (list != NULL) {
        Py_SETREF(list, PyList_AsTuple(list));
    }
    return list;
}

PyObject *
ac_status(ac_state *st)
{
    PyObject *d = NULL, *reason = NULL, *es, *config, *r = NULL;
    int ok;

    if (ac_lock_read_back(st) < 0) {
        return NULL;
    }
    reason = reason_locked(st);
    d = PyDict_New();
    if (reason == NULL || d == NULL) {
        goto done;
    }
    /* What torch holds, string for string, once attached; before, what
     * will be written (or the user's string, where nothing will be). */
    if (st->attached && st->in_force != NULL) {
        config = st->in_force;
    }
    else {
        unsigned mask;
        config =
            st->block != AC_OK ? st->user_raw : ac_target_locked(st, &mask);
    }
    es = st->block != AC_OK ? Py_None
         : st->n_off > 0    ? Py_False
         : st->n_on > 0     ? Py_True
         : st->base_es == 1 ? Py_True
                            : Py_False;
    {
        PyObject *src =
            st->source ? PyUnicode_FromString(st->source) : Py_NewRef(Py_None);
        PyObject *depth =
            PyLong_FromSsize_t(st->n_off + st->n_on + ac_routed_locked(st));
        PyObject *scope = ac_scope_locked(st);
        PyObject *scope_why = ac_scope_reason_locked(st);
        PyObject *pool_bytes = PyLong_FromSize_t(cu_pool_bytes());
        PyObject *advice = advice_locked(st);
        PyObject *keys = PyDict_Keys(st->neighbours);
        PyObject *neighbours = keys ? PyList_AsTuple(keys) : NULL;
        PyObject *values[AC_NKEYS];
        size_t i;

        values[AC_KEY_APPLIED] =
            (st->attached && ac_may_write(st) && st->writes > 0) ? Py_True
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
        values[AC_KEY_NEIGHBOURS] = neighbours;
        values[AC_KEY_READBACK] = !st->attached ? Py_None
                                  : st->getter  ? Py_True
                                                : Py_False;
        values[AC_KEY_WINDOW_SCOPE] = scope;
        values[AC_KEY_WINDOW_SCOPE_REASON] = scope_why;
        values[AC_KEY_POOL_BYTES] = pool_bytes;
        ok = src != NULL && depth != NULL && advice != NULL &&
             neighbours != NULL && scope != NULL && scope_why != NULL &&
             pool_bytes != NULL;
        for (i = 0; ok && i < AC_NKEYS; i++) {
            ok = PyDict_SetItem(d, st->status_keys[i], values[i]) == 0;
        }
        Py_XDECREF(src);
        Py_XDECREF(depth);
        Py_XDECREF(advice);
        Py_XDECREF(keys);
        Py_XDECREF(neighbours);
        Py_XDECREF(scope);
        Py_XDECREF(scope_why);
        Py_XDECREF(pool_bytes);
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

/* What torch holds outside windows (borrowed), None where allocconf
 * writes nothing. */
static PyObject *
export_base_locked(const ac_state *st)
{
    if (!ac_may_write(st) || st->str_base == NULL) {
        return Py_None;
    }
    return st->base_es == 1 ? st->str_base : st->str_off;
}

PyObject *
ac_internals(ac_state *st)
{
    PyObject *r, *base;

    if (ac_lock_read_back(st) < 0) {
        return NULL;
    }
    base = export_base_locked(st);
    r = Py_BuildValue(
        "{s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:O,s:O,s:s,s:n,s:n,s:O}",
        "variables", names_of(AC_READS_ALL), "reads",
        names_of(ac_env_reads_of(st)), "attached",
        PyBool_FromLong(st->attached), "auto", PyBool_FromLong(st->auto_on),
        "step_back", PyBool_FromLong(st->step_back), "keep_foreign",
        PyBool_FromLong(st->keep_foreign), "export",
        PyBool_FromLong(st->export_env), "at_fork",
        PyBool_FromLong(st->at_fork), "base", base, "user",
        st->user_raw ? st->user_raw : Py_None, "source", st->source,
        "foreign_writes", st->foreign_n, "unseen", st->unseen, "torch_version",
        st->torch_version ? st->torch_version : Py_None);
    ac_unlock(st);
    return r;
}

PyObject *
ac_export_base(ac_state *st)
{
    PyObject *r;

    if (ac_lock(st) < 0) {
        return NULL;
    }
    r = !st->export_env || !st->attached ? Py_None : export_base_locked(st);
    Py_INCREF(r);
    ac_unlock(st);
    return r;
}
