/*
 * errors.h -- AllocConfError with key, offset and snippet; the texts of
 * the warnings allocconf collects.
 */
#ifndef ALLOCCONF_ERRORS_H
#define ALLOCCONF_ERRORS_H

#include "state/state.h"

/* The text of `conf` as char data: UTF-8 of a str, or a bytes' bytes.
 * Returns 0, or -1 with an exception set. */
int ac_conf_chars(PyObject *conf, const char **s, Py_ssize_t *n);

/* A new str: "key at offset N: message (in '...snippet...')", the
 * snippet a window of `conf` (str or bytes) around the fault.  NULL with
 * an exception set on error. */
PyObject *ac_error_message(const ac_error *err, PyObject *conf);

/* Raise AllocConfError for *err about `conf` (a str or bytes object).
 * Always returns NULL. */
PyObject *ac_raise(ac_state *st, const ac_error *err, PyObject *conf);

/* Raise AllocConfError with the message `msg` (consumed; NULL: an error
 * is already set) and no position.  `cause` (may be NULL, borrowed)
 * becomes its __cause__. */
void ac_raise_plain(ac_state *st, PyObject *msg, PyObject *cause);

/* Raise AllocConfError saying torch refused to hold `target`, torch's
 * own exception `exc` (consumed) its cause. */
void ac_raise_refused(ac_state *st, PyObject *target, PyObject *exc);

/* Raise for a write of `target` that failed with `exc` (consumed): the
 * AllocConfError of ac_raise_refused, or, when the setter had called back
 * into allocconf (`reentered`), a RuntimeError saying so, `exc` its
 * cause: allocconf's own guard failed the write, not torch. */
void ac_raise_write_failed(ac_state *st, PyObject *target, PyObject *exc,
                           int reentered);

/* With an error set: clear it when it is an ordinary one (an Exception
 * other than MemoryError: a torch attribute that raises, say) and return
 * 1; leave it set and return 0 for the others (KeyboardInterrupt,
 * SystemExit, MemoryError), which must propagate. */
int ac_clear_ordinary(void);

/* Append the str `text` (consumed; NULL: an error is already set) to the
 * list `warnings`.  0, or -1 with an exception set. */
int ac_warn_append(PyObject *warnings, PyObject *text);

#endif /* ALLOCCONF_ERRORS_H */
