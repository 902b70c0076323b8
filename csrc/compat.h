/*
 * compat.h -- the few newer C-API calls allocconf uses, for the older
 * Pythons it supports (3.9 and up).
 */
#ifndef ALLOCCONF_COMPAT_H
#define ALLOCCONF_COMPAT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *
Py_NewRef(PyObject *o)
{
    Py_INCREF(o);
    return o;
}

static inline PyObject *
Py_XNewRef(PyObject *o)
{
    Py_XINCREF(o);
    return o;
}

static inline int
PyModule_AddObjectRef(PyObject *m, const char *name, PyObject *value)
{
    int rc;
    Py_INCREF(value);
    rc = PyModule_AddObject(m, name, value);
    if (rc < 0) {
        Py_DECREF(value);
    }
    return rc;
}
#endif

#if PY_VERSION_HEX < 0x030C0000
static inline PyObject *
PyErr_GetRaisedException(void)
{
    PyObject *type, *value, *tb;

    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL && tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

/* Steals exc; NULL clears the error indicator, as in 3.12. */
static inline void
PyErr_SetRaisedException(PyObject *exc)
{
    PyObject *type;

    if (exc == NULL) {
        PyErr_Clear();
        return;
    }
    type = (PyObject *)Py_TYPE(exc);
    Py_INCREF(type);
    PyErr_Restore(type, exc, PyException_GetTraceback(exc));
}
#endif

#if PY_VERSION_HEX < 0x030D0000
/* 1 and *result set when found, 0 and NULL when missing, -1 on error. */
static inline int
PyObject_GetOptionalAttrString(PyObject *obj, const char *name,
                               PyObject **result)
{
    *result = PyObject_GetAttrString(obj, name);
    if (*result != NULL) {
        return 1;
    }
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}
#endif

#endif /* ALLOCCONF_COMPAT_H */
