/*
 * status.c -- status(): the configuration torch holds (or will), whether
 * expandable segments are on in it, and a sentence saying why, all read
 * under the lock from the state, so they agree with each other.
 */
#include "status.h"
#include "config.h"

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
            "%V in %s: that backend has no expandable segments; allocconf "
            "writes nothing",
            st->block_detail, "backend", src);
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

    if (list != NULL && st->block == AC_OK && st->refused == NULL &&
        st->base_es == 1 && ac_conf_es(&st->user) < 0 &&
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
        unsigned mask;
        PyObject *t = ac_target_locked(st, &mask);
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
