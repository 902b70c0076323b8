/*
 * state.h -- the module state: what allocconf knows and holds, its lock,
 * and tracing.  The second layer of csrc/ (docs/design.md, "Layers"),
 * with the pure transitions beside it (layers.c, environ.c): nothing in
 * this layer calls torch.
 *
 * Every field of ac_state is read and written only with the state lock
 * held (ac_lock / ac_unlock), except the type objects and interned names
 * made at module exec and never replaced; `pid`, written only by the
 * at-fork handler in a child that has one thread; and `getter` and `seq`,
 * which the read-back (torchio/write.c) reads first without the lock,
 * with the GIL held, checking `seq` again under the lock.  The one piece of
 * Python code allowed under the lock is torch's setter (docs/design.md,
 * "Locks").
 */
#ifndef ALLOCCONF_STATE_H
#define ALLOCCONF_STATE_H

#include "compat.h"
#include "grammar/conf.h"

#include <pythread.h>
#include <stdint.h>
#include <sys/types.h>

/* Why allocconf writes nothing to torch (0 when it may write). */
typedef enum {
    AC_OK = 0,
    AC_BLOCK_MALFORMED, /* the user's configuration does not parse */
    AC_BLOCK_ASYNC,     /* backend:cudaMallocAsync ignores the setting */
    AC_BLOCK_PLATFORM,  /* Windows or macOS */
    AC_BLOCK_ROCM,      /* ROCm older than 7 */
    AC_BLOCK_NO_SETTER, /* this torch has no run-time setter */
    AC_BLOCK_REFUSED,   /* torch refused a write, and what it holds does not
                           parse: nothing to build windows on */
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
    X(NEIGHBOURS, "neighbours")                                               \
    X(ADVICE, "advice")                                                       \
    X(READBACK, "readback")                                                   \
    X(WINDOW_SCOPE, "window_scope")                                           \
    X(WINDOW_SCOPE_REASON, "window_scope_reason")                             \
    X(POOL_BYTES, "pool_bytes")

#define AC_ENUM_FIELD(name, text) AC_KEY_##name,
enum { AC_STATUS_FIELDS(AC_ENUM_FIELD) AC_NKEYS };
#undef AC_ENUM_FIELD

/* Every Python object the state owns, once: m_traverse and m_clear are
 * generated from this list, so they cannot drift apart.  Each str here is
 * an exact str that allocconf made or copied: hashing, comparing or
 * formatting one under the lock runs no Python code. */
#define AC_OWNED_FIELDS(X)                                                    \
    X(error_type)    /* allocconf.AllocConfError (ValueError) */              \
    X(warning_type)  /* allocconf.AllocConfWarning (UserWarning) */           \
    X(setter)        /* torch's setter, callable(str), or NULL */             \
    X(getter)        /* torch's getter (2.13+), callable(), or NULL */        \
    X(api)           /* str naming the setter, or NULL */                     \
    X(torch_version) /* str, or NULL */                                       \
    X(user_raw)      /* str: the user's string as torch holds it */           \
    X(env_raw)       /* str: the variable's value ("" when unset) */          \
    X(env_seen)      /* tuple: the environment last read */                   \
    X(block_detail)  /* str or NULL: what made it block */                    \
    X(refused)       /* str or NULL: torch's words when it refused a write */ \
    X(str_base)      /* the layers, with allocconf's default */               \
    X(str_on)        /* ... with expandable_segments:True */                  \
    X(str_off)       /* ... with expandable_segments:False */                 \
    X(in_force)      /* str: what torch holds, NULL when not known */         \
    X(writer)        /* str: who last changed the configuration at run time   \
                        (configure() or a setter another component called),   \
                        NULL when nobody did */                               \
    X(neighbours)    /* dict: neighbour name -> why it cannot live with       \
                        expandable segments (str), made at init */            \
    X(stepped_back)  /* str: the neighbour the default stepped back for */    \
    X(pool_api)      /* tuple (begin, end, release, current_device,           \
                        initialized, make) of torch's pool routing and        \
                        allocconf._pools.make, or NULL: ipc_safe() windows    \
                        hold process-wide (scoped.c) */                       \
    X(scope_why)     /* str: why windows hold process-wide, or NULL */        \
    X(pools)         /* list: allocconf's torch.cuda.MemPool objects, by      \
                        pool number (kept for the life of the process) */     \
    X(pool_ids)      /* list: their ids, the tuples torch takes */

/* Open windows of one thread. */
typedef struct {
    unsigned long thread;
    Py_ssize_t off;    /* holding expandable segments off (process-wide) */
    Py_ssize_t on;     /* holding them on */
    Py_ssize_t routed; /* ipc_safe() windows routing this thread's
                          allocations to allocconf's pools */
    Py_ssize_t held;   /* ipc_safe() windows of the opener's scope held
                          process-wide instead (each counted in `off`
                          too): CUDA was not up when the first opened */
    size_t *routes;    /* the pools routed while routed > 0 (numbers into
                          st->pool_slots), n_routes of them */
    size_t n_routes;
} ac_opener;

/* One of allocconf's pools: its device, and whether a thread's windows
 * route to it now (one thread per pool: torch ends a route by the pool's
 * id, whoever began it). */
typedef struct {
    int device;
    int busy;
} ac_pool_slot;

#define AC_DECLARE_FIELD(name) PyObject *name;

typedef struct {
#if PY_VERSION_HEX >= 0x030D0000
    PyMutex mutex;
#else
    PyThread_type_lock mutex;
#endif
    unsigned long owner; /* thread ident holding the lock, or 0 */
    int reentered;       /* the lock's owner called back into allocconf (from
                            torch's setter) since the last setter call began */
    pid_t pid;           /* the process this state is in */
    int64_t interp;      /* the id of the interpreter that made it */
    PyObject *status_keys[AC_NKEYS]; /* interned field names of status() */
    AC_OWNED_FIELDS(AC_DECLARE_FIELD)

    /* The configuration, in two layers (layers.c): the user's, which is
     * the floor, and the last write another component made. */
    ac_conf user;        /* the variable torch reads, and configure() */
    ac_conf foreign;     /* the keys of the last write by another
                            component, with the sticky keys earlier ones
                            set and it left out (torch keeps those) */
    int whole;           /* `foreign` is all that torch holds, without the
                            user's layer under it (layers.c says when) */
    const char *source;  /* static: an env var name, "torch", or NULL */
    unsigned reads;      /* the variables torch reads (AC_READS_*), 0 until
                            torch is seen */
    const char *opt_out; /* static: a variable torch does not apply that
                            says expandable_segments:False, or NULL */
    int configured;      /* configure() was called */
    int loaded;          /* the environment has been read */
    int auto_on;         /* ALLOCCONF_AUTO */
    int step_back;       /* ALLOCCONF_STEP_BACK: step back for neighbours */
    int keep_foreign;    /* ALLOCCONF_KEEP_FOREIGN: wrap torch's setters */
    int export_env;      /* ALLOCCONF_EXPORT: write the variable torch reads */
    int debug;           /* ALLOCCONF_DEBUG: trace writes to stderr */
    int at_fork;         /* os.register_at_fork took the child handler */
    ac_block block;

    /* The strings to write, precomputed so a window only picks one, and
     * the sticky keys each names (ac_sticky_mask). */
    int base_es; /* expandable_segments in str_base: 0, 1, -1 unset */
    unsigned mask_base, mask_on, mask_off;

    /* Torch and the windows. */
    int attached;           /* torch has been imported and seen */
    int cpu_only;           /* torch built without CUDA or ROCm */
    unsigned mask_in_force; /* the sticky keys of in_force */
    unsigned sticky_known;  /* the sticky keys this torch knows */
    Py_ssize_t seq;         /* moves on before and after each call
                               allocconf makes to torch's setter */
    Py_ssize_t writes;      /* of them, writes of allocconf's strings */
    Py_ssize_t foreign_n;   /* setter calls by other components, kept */
    Py_ssize_t unseen;      /* writes allocconf found only by reading back
                               what torch holds */
    Py_ssize_t n_off;       /* open windows holding expandable segments off */
    Py_ssize_t n_on;        /* open windows holding them on */
    ac_opener *openers;     /* per thread, for fork(): n_openers of them */
    size_t n_openers, cap_openers;
    ac_pool_slot *pool_slots; /* the pools in st->pools, n_pools of them */
    size_t n_pools, cap_pools;
} ac_state;

#undef AC_DECLARE_FIELD

/* Whether allocconf writes to torch at all: not under a block, except
 * backend:cudaMallocAsync, where it writes what configure() and other
 * components give it (the backend named as torch loaded it) and never
 * expandable segments of its own (layers.c).  Lock held. */
static inline int
ac_may_write(const ac_state *st)
{
    return st->block == AC_OK || st->block == AC_BLOCK_ASYNC;
}

/* Set up a zeroed state at module exec: the lock, the interned names, and
 * the claim that makes it the process's only one.  0, or -1 with an
 * exception set (ImportError when another state is alive). */
int ac_state_init(ac_state *st);

/* m_traverse, m_clear and m_free of the module. */
int ac_state_traverse(ac_state *st, visitproc visit, void *arg);
void ac_state_clear(ac_state *st);
void ac_state_free(ac_state *st);

/* Lock the state.  Returns 0, or -1 with RuntimeError set when this
 * thread already holds it (a torch setter that calls back into
 * allocconf), noting that in `reentered`. */
int ac_lock(ac_state *st);
void ac_unlock(ac_state *st);

/* A new lock for a child just forked, whatever the parent's threads did
 * with the old one.  0, or -1 when out of memory (no exception set). */
int ac_lock_renew(ac_state *st);

/* Run fn(st, arg, warnings) with the lock held and a new list for the
 * warning texts it collects; return that list, or NULL with an exception
 * set when fn returns -1. */
typedef int (*ac_locked_fn)(ac_state *st, void *arg, PyObject *warnings);
PyObject *ac_with_warnings(ac_state *st, ac_locked_fn fn, void *arg);

/* The windows of thread `me` (an entry made when it has none), or NULL
 * when out of memory (no exception set).  Lock held. */
ac_opener *ac_opener_of(ac_state *st, unsigned long me);

/* Drop the entry o when it holds no window (o may then name another
 * thread's entry: do not use it after).  Lock held. */
void ac_opener_tidy(ac_state *st, ac_opener *o);

/* Trace to stderr when ALLOCCONF_DEBUG is on: `what`, then the str `s`
 * quoted when given.  Lock held (trace_locked) or not (ac_trace). */
void ac_trace_locked(ac_state *st, const char *what, PyObject *s);
void ac_trace(ac_state *st, const char *msg);

#endif /* ALLOCCONF_STATE_H */
