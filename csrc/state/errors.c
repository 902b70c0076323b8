/*
 * errors.c -- AllocConfError: a ValueError naming the key, the character
 * offset and the offending text, with a snippet of the string around the
 * fault; and the warning texts collected for the Python side to give.
 */
#include "state/errors.h"

#include <stdio.h>
#include <string.h>

int
ac_conf_chars(PyObject *conf, const char **s, Py_ssize_t *n)
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

PyObject *
ac_error_message(const ac_error *err, PyObject *conf)
{
    enum { BEFORE = 30, AFTER = 30 };
    const char *s;
    Py_ssize_t n, lo, hi, off = (Py_ssize_t)err->offset;
    PyObject *snippet, *msg;

    if (err->nomem) {
        return PyErr_NoMemory();
    }
    if (ac_conf_chars(conf, &s, &n) < 0) {
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
    /* The text may be cut inside a UTF-8 sequence (AC_ERR_TEXT). */
    v = PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "backslashreplace");
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

    msg = ac_error_message(err, conf);
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

void
ac_raise_plain(ac_state *st, PyObject *msg, PyObject *cause)
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
        if (cause != NULL) {
            PyException_SetCause(exc, Py_NewRef(cause)); /* steals */
        }
        PyErr_SetObject(st->error_type, exc);
    }
    Py_DECREF(exc);
}

void
ac_raise_refused(ac_state *st, PyObject *target, PyObject *exc)
{
    /* str(exc) may run Python: this is called without the lock. */
    ac_raise_plain(st,
                   PyUnicode_FromFormat("allocconf: torch refused '%U': %S; "
                                        "it holds what it held before",
                                        target, exc ? exc : Py_None),
                   exc);
    Py_XDECREF(exc);
}

void
ac_raise_write_failed(ac_state *st, PyObject *target, PyObject *exc,
                      int reentered)
{
    PyObject *err;

    if (!reentered) {
        ac_raise_refused(st, target, exc);
        return;
    }
    PyErr_Format(PyExc_RuntimeError,
                 "allocconf: torch's setter called back into allocconf "
                 "while allocconf was writing '%U' through it, and the write "
                 "failed; nothing changed. Call allocconf after the setter "
                 "returns, not from inside it",
                 target);
    err = PyErr_GetRaisedException();
    if (err != NULL && exc != NULL) {
        PyException_SetCause(err, Py_NewRef(exc)); /* steals */
    }
    PyErr_SetRaisedException(err);
    Py_XDECREF(exc);
}

int
ac_clear_ordinary(void)
{
    if (PyErr_ExceptionMatches(PyExc_Exception) &&
        !PyErr_ExceptionMatches(PyExc_MemoryError)) {
        PyErr_Clear();
        return 1;
    }
    return 0;
}

int
ac_warn_append(PyObject *warnings, PyObject *text)
{
    int rc;

    if (text == NULL) {
        return -1;
    }
    rc = PyList_Append(warnings, text);
    Py_DECREF(text);
    return rc;
}
