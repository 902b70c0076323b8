/*
 * apply.h -- the module state and the operations on it: read the
 * environment, attach to torch, configure, open and close windows.
 *
 * Every field of ac_state is read and written only with the state lock
 * held (ac_lock / ac_unlock), except the immutable type objects.
 */
#ifndef ALLOCCONF_APPLY_H
#define ALLOCCONF_APPLY_H

#include "compat.h"
#include "conf.h"

#include <pythread.h>

/* Why allocconf writes nothing to torch (0 when it may write). */
typedef enum {
    AC_OK = 0,
    AC_BLOCK_MALFORMED, /* the user's configuration does not parse */
    AC_BLOCK_ASYNC,     /* backend:cudaMallocAsync ignores the setting */
    AC_BLOCK_PLATFORM,  /* Windows or macOS */
    AC_BLOCK_ROCM,      /* ROCm older than 7 */
    AC_BLOCK_NO_SETTER, /* this torch has no run-time setter */
} ac_block;

/* The fields of status(), in order; their names are interned once into
 * ac_state.status_keys. */
#define AC_STATUS_FIELDS(X)                                                   \
    X(APPLIED, "applied")                                                     \
    X(REASON, "reason")                                                       \
    X(EXPANDABLE, "expandable_segments")                                      \
    X(CONFIG, "config")                                                       \
    X(SOURCE, "source")                                                       \
    X(API, "api")                                                             \
    X(TORCH_IMPORTED, "torch_imported")                                       \
    X(WINDOW_DEPTH, "window_depth")                                           \
    X(USER_CONFIG, "user_config")                                             \
    X(ADVICE, "advice")

#define AC_ENUM_FIELD(name, text) AC_KEY_##name,
enum { AC_STATUS_FIELDS(AC_ENUM_FIELD) AC_NKEYS };
#undef AC_ENUM_FIELD

typedef struct {
#if PY_VERSION_HEX >= 0x030D0000
    PyMutex mutex;
#else
    PyThread_type_lock mutex;
#endif
    unsigned long owner; /* thread ident holding the lock, or 0 */

    /* Types, created at module exec and never replaced. */
    PyObject *error_type;   /* allocconf.AllocConfError (ValueError) */
    PyObject *warning_type; /* allocconf.AllocConfWarning (UserWarning) */
    PyObject *status_keys[AC_NKEYS]; /* interned field names of status() */

    /* What torch offers, resolved once when torch is attached. */
    PyObject *setter;        /* callable(str), or NULL */
    PyObject *api;           /* str naming the setter, or NULL */
    PyObject *torch_version; /* str, or NULL */

    /* The user's configuration and where it came from. */
    ac_conf user;
    PyObject *user_raw; /* str: the user's string as torch holds it */
    const char *source; /* static: an env var name, "torch", or NULL */
    PyObject *env_raw;  /* str: the variable's value ("" when unset) */
    PyObject *env_seen; /* tuple: the environment last read, to notice
                           a change made before torch was imported */
    int configured;     /* configure() was called */
    int loaded;         /* the environment has been read */
    int auto_on;        /* ALLOCCONF_AUTO */
    int debug;          /* ALLOCCONF_DEBUG: trace writes to stderr */
    ac_block block;
    PyObject *block_detail; /* str or NULL: what made it block */

    /* The strings to write, precomputed so a window only picks one. */
    PyObject *str_base; /* the user's configuration, allocconf default in */
    PyObject *str_on;   /* ... with expandable_segments:True */
    PyObject *str_off;  /* ... with expandable_segments:False */
    int base_es;        /* expandable_segments in str_base: 0, 1, -1 unset */

    /* Torch and the windows. */
    int attached;       /* torch has been imported and seen */
    int cpu_only;       /* torch built without CUDA or ROCm */
    PyObject *in_force; /* str: what torch holds (our last write) */
    Py_ssize_t writes;  /* writes made through the setter */
    Py_ssize_t n_off;   /* open windows holding expandable segments off */
    Py_ssize_t n_on;    /* open windows holding them on */
} ac_state;

/* Write `msg` to stderr when ALLOCCONF_DEBUG is on. */
void ac_trace(ac_state *st, const char *msg);

/* Intern the status() field names into st.  0, or -1 with an exception. */
int ac_init_keys(ac_state *st);

/* Lock the state.  Returns 0, or -1 with RuntimeError set when this
 * thread already holds it (a torch setter that calls back into
 * allocconf). */
int ac_lock(ac_state *st);
void ac_unlock(ac_state *st);

/* Raise AllocConfError for *err about `conf` (a str or bytes object).
 * Always returns NULL. */
PyObject *ac_raise(ac_state *st, const ac_error *err, PyObject *conf);

/* Read PYTORCH_*_ALLOC_CONF, ALLOCCONF_AUTO and ALLOCCONF_DEBUG.
 * Returns a new list of warning texts, or NULL with an exception set. */
PyObject *ac_load_environ(ac_state *st);

/* Attach to the torch module: find the setter, read the live string,
 * write allocconf's configuration.  Returns a new list of warning texts,
 * or NULL with an exception set (nothing changed in that case). */
PyObject *ac_attach(ac_state *st, PyObject *torch);

/* The configuration string torch holds now, where it can tell without
 * initialising CUDA (the 2.13+ getter; the snapshot once CUDA is up).  A
 * new str, or NULL with no exception set when torch cannot tell. */
PyObject *ac_read_live(PyObject *torch);

/* Merge `conf` (str or NULL) and `overrides` (dict or NULL) into the
 * user's configuration and write it.  Returns the new configuration as a
 * new str, or NULL with an exception set and the state unchanged. */
PyObject *ac_configure(ac_state *st, PyObject *conf, PyObject *overrides);

/* Open (enter=1) or close (enter=0) a window holding expandable segments
 * at `enabled`.  Returns 0, or -1 with an exception set. */
int ac_window(ac_state *st, int enabled, int enter);

/* A new dict with the fields of allocconf.Status, or NULL. */
PyObject *ac_status(ac_state *st);

/* Turn a Python override value into canonical text for `key`:
 * a new str, Py_None (new reference) for "remove", or NULL. */
PyObject *ac_override_text(ac_state *st, const char *key, PyObject *value);

/* The canonical string of c without `skip_key` entries (may be NULL),
 * checked by parsing it again (the rules between keys).  A new str, or
 * NULL with AllocConfError set, its offset into that string. */
PyObject *ac_checked_string(ac_state *st, const ac_conf *c,
                            const char *skip_key);

/* Apply `overrides` (a dict of key -> value) to *c.  Returns 0, or -1
 * with an exception set (c may be partly changed: work on a copy). */
int ac_apply_overrides(ac_state *st, ac_conf *c, PyObject *overrides);

#endif /* ALLOCCONF_APPLY_H */
