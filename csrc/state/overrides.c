/*
 * overrides.c -- from Python values to configuration text.
 *
 * A value is a str, a bool ("True"/"False", numpy.bool_ too), an integer
 * (an int, or anything operator.index takes: numpy.int64), a real
 * (anything float() takes: its float's repr, "1e-05" included), None
 * (remove the key), or for a list value such as
 * roundup_power2_divisions a dict {256: 1, ">": 8} or a sequence of
 * pairs.  Everything here may run user code (a key's or value's
 * __str__), so it runs before the state lock is taken, and it holds
 * strong references to everything it reads: the containers are copied
 * first (PyDict_Items, PySequence_Tuple), so a __str__ that empties them
 * changes nothing here.
 */
#include "state/overrides.h"
#include "state/errors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* numpy.bool_ (numpy.bool on numpy 2), which is no bool subclass and
 * which operator.index refuses, told by its type's name: numpy is never
 * imported here. */
static int
is_numpy_bool(PyObject *v)
{
    const char *name = Py_TYPE(v)->tp_name;
    return strcmp(name, "numpy.bool") == 0 || strcmp(name, "numpy.bool_") == 0;
}

/* Whether v is a number a value can be: an integer (operator.index takes
 * it) or a real (float() takes it), a str never. */
static int
is_number(PyObject *v)
{
    PyNumberMethods *nb = Py_TYPE(v)->tp_as_number;
    return !PyUnicode_Check(v) &&
           (PyIndex_Check(v) || (nb != NULL && nb->nb_float != NULL));
}

/* A new str for a number: an integer in decimal (whatever a subclass's
 * __str__ says), a real as its float's repr.  NULL on error. */
static PyObject *
number_text(PyObject *v)
{
    PyObject *n = PyIndex_Check(v) ? PyNumber_Index(v) : PyNumber_Float(v);
    PyObject *r;

    if (n == NULL) {
        return NULL;
    }
    r = PyLong_Check(n) ? PyLong_Type.tp_repr(n) : PyFloat_Type.tp_repr(n);
    Py_DECREF(n);
    return r;
}

/* A new str for a scalar: a str as it is, a boolean as True/False, a
 * number as number_text says, anything else its str().  NULL on
 * error. */
static PyObject *
scalar_text(PyObject *v)
{
    if (PyUnicode_Check(v)) {
        return Py_NewRef(v);
    }
    if (PyBool_Check(v) || is_numpy_bool(v)) {
        int truth = PyObject_IsTrue(v);
        return truth < 0 ? NULL
                         : PyUnicode_FromString(truth ? "True" : "False");
    }
    if (is_number(v)) {
        return number_text(v);
    }
    return PyObject_Str(v);
}

/* A new str for one list item: "k:v" for a pair, else the scalar. */
static PyObject *
item_text(PyObject *item)
{
    PyObject *ks, *vs, *r;

    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
        return scalar_text(item);
    }
    /* The tuple holds its two items for as long as we hold it. */
    ks = scalar_text(PyTuple_GET_ITEM(item, 0));
    if (ks == NULL) {
        return NULL;
    }
    vs = scalar_text(PyTuple_GET_ITEM(item, 1));
    if (vs == NULL) {
        Py_DECREF(ks);
        return NULL;
    }
    r = PyUnicode_FromFormat("%U:%U", ks, vs);
    Py_DECREF(ks);
    Py_DECREF(vs);
    return r;
}

/* A new str "[a:b,c:d]" from a dict or a sequence of pairs, or NULL. */
static PyObject *
list_text(PyObject *value)
{
    PyObject *items, *parts = NULL, *sep = NULL, *joined = NULL, *r = NULL;
    Py_ssize_t i, n;

    /* Copies, with strong references to every item. */
    items =
        PyDict_Check(value) ? PyDict_Items(value) : PySequence_Tuple(value);
    if (items == NULL) {
        return NULL;
    }
    n = PySequence_Fast_GET_SIZE(items);
    parts = PyList_New(n);
    if (parts == NULL) {
        goto done;
    }
    for (i = 0; i < n; i++) {
        PyObject *t = item_text(PySequence_Fast_GET_ITEM(items, i));
        if (t == NULL) {
            goto done;
        }
        PyList_SET_ITEM(parts, i, t);
    }
    sep = PyUnicode_FromString(",");
    joined = sep == NULL ? NULL : PyUnicode_Join(sep, parts);
    if (joined != NULL) {
        r = PyUnicode_FromFormat("[%U]", joined);
    }
done:
    Py_DECREF(items);
    Py_XDECREF(parts);
    Py_XDECREF(sep);
    Py_XDECREF(joined);
    return r;
}

/* Raise AllocConfError for *err in `key`:`text`, the offset moved into
 * that string (a fault in the key itself stays at 0). */
static void
raise_in_override(ac_state *st, ac_error *err, const char *key, PyObject *text,
                  int in_value)
{
    PyObject *conf = PyUnicode_FromFormat("%s:%U", key, text);

    if (conf == NULL) {
        return;
    }
    if (in_value) {
        err->offset += strlen(key) + 1;
    }
    if (err->key[0] == '\0') {
        snprintf(err->key, sizeof(err->key), "%s", key);
    }
    ac_raise(st, err, conf);
    Py_DECREF(conf);
}

/* The canonical text for `key` = `value`: a malloc'd string in *norm, or
 * *norm NULL for None.  0, or -1 with an exception set. */
static int
override_text(ac_state *st, const char *key, PyObject *value, char **norm)
{
    PyObject *text;
    ac_error err;
    const char *s;

    *norm = NULL;
    if (value == Py_None) {
        text = PyUnicode_FromString("None");
    }
    else if (PyUnicode_Check(value) || PyBool_Check(value) ||
             is_numpy_bool(value) || is_number(value)) {
        text = scalar_text(value);
    }
    else if (PyDict_Check(value) || PyList_Check(value) ||
             PyTuple_Check(value)) {
        text = list_text(value);
    }
    else {
        PyErr_Format(PyExc_TypeError,
                     "allocconf: %s: a value must be a str, a bool, an "
                     "integer, a real number, a dict or a list, not %.100s",
                     key, Py_TYPE(value)->tp_name);
        return -1;
    }
    if (text == NULL) {
        return -1;
    }
    if (!ac_is_word(key)) {
        ac_error bad;
        memset(&bad, 0, sizeof(bad));
        snprintf(bad.key, sizeof(bad.key), "%s", key);
        snprintf(bad.text, sizeof(bad.text), "%s", key);
        snprintf(bad.message, sizeof(bad.message),
                 "'%.60s' is not a key (one word: no separator or space)",
                 key);
        raise_in_override(st, &bad, key, text, 0);
        Py_DECREF(text);
        return -1;
    }
    if (value == Py_None) {
        Py_DECREF(text);
        return 0;
    }
    s = PyUnicode_AsUTF8(text);
    if (s == NULL) {
        Py_DECREF(text);
        return -1;
    }
    if (ac_value_parse(key, s, norm, &err) < 0) {
        if (err.nomem) {
            PyErr_NoMemory();
        }
        else {
            raise_in_override(st, &err, key, text, 1);
        }
        Py_DECREF(text);
        return -1;
    }
    Py_DECREF(text);
    return 0;
}

int
ac_overrides_patch(ac_state *st, PyObject *kwargs, ac_conf *patch)
{
    PyObject *items;
    Py_ssize_t i, n;

    if (kwargs == NULL) {
        return 0;
    }
    items = PyDict_Items(kwargs); /* a copy: user code may change kwargs */
    if (items == NULL) {
        return -1;
    }
    n = PyList_GET_SIZE(items);
    patch->items = calloc(n ? (size_t)n : 1, sizeof(ac_entry));
    patch->cap = n ? (size_t)n : 1;
    if (patch->items == NULL) {
        Py_DECREF(items);
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(items, i);
        const char *key = PyUnicode_AsUTF8(PyTuple_GET_ITEM(pair, 0));
        ac_entry *e = &patch->items[patch->len];
        if (key == NULL) {
            goto error;
        }
        e->key = malloc(strlen(key) + 1);
        if (e->key == NULL) {
            PyErr_NoMemory();
            goto error;
        }
        memcpy(e->key, key, strlen(key) + 1);
        patch->len++;
        if (override_text(st, key, PyTuple_GET_ITEM(pair, 1), &e->value) < 0) {
            goto error;
        }
    }
    Py_DECREF(items);
    return 0;

error:
    Py_DECREF(items);
    ac_conf_clear(patch);
    return -1;
}
