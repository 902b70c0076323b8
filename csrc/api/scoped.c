/*
 * scoped.c -- ipc_safe() windows of the opener's scope (see scoped.h).
 *
 * The outermost such window of a thread takes one of allocconf's pools
 * on each device the process uses (the current one, and each whose
 * primary context is active) and asks torch to route the thread's
 * allocations there (torch.cuda.use_mem_pool's route, without its
 * Python frame); the last to close ends the routes and gives the pools
 * back.  A pool serves one thread at a time, because torch ends a route
 * by the pool's id whoever began it: a second thread with a window open
 * at the same moment gets a pool of its own, made when first needed and
 * kept for the next.  Nested windows only count.
 *
 * The pools stay until release_pools(), and what their windows freed
 * stays cached in them for the next window: torch has no call that
 * empties a pool that stays (torch.cuda.empty_cache() passes over pools
 * in use), and ending a pool while any thread on its device is inside
 * another pool's context or a graph capture trips an assertion inside
 * torch, so only the caller can say when it is safe.
 * status().pool_bytes says what they hold.
 *
 * A window that cannot route holds expandable segments off process-wide
 * (api/window.c) and counts as `held`, as do the windows nested in it:
 * before torch is attached, on a torch without the routing, and while
 * CUDA is not initialised (routing needs it; a window must not start
 * it, so that one opened before fork() stays fork-safe).
 */
#include "api/scoped.h"
#include "api/window.h"
#include "driver/alloc.h"
#include "state/errors.h"
#include "torchio/torch.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Pools                                                                */
/* ------------------------------------------------------------------ */

/* Take a free pool on `device` for this thread, making one when none is
 * free: its number in *slot and a new reference to its id in *id.  0,
 * or -1 with an exception set. */
static int
take_pool(ac_state *st, PyObject *api, int device, size_t *slot, PyObject **id)
{
    PyObject *pool = NULL;
    size_t i;
    int rc = -1;

    if (ac_lock(st) < 0) {
        return -1;
    }
    for (i = 0; i < st->n_pools; i++) {
        if (st->pool_slots[i].device == device && !st->pool_slots[i].busy) {
            st->pool_slots[i].busy = 1;
            *slot = i;
            *id = Py_NewRef(PyList_GET_ITEM(st->pool_ids, (Py_ssize_t)i));
            ac_unlock(st);
            return 0;
        }
    }
    ac_unlock(st);
    /* torch's code makes the pool: without the lock. */
    pool = ac_pools_make(api, device);
    *id = pool ? PyObject_GetAttrString(pool, "id") : NULL;
    if (*id == NULL) {
        goto done;
    }
    if (ac_lock(st) < 0) {
        goto done;
    }
    if (st->n_pools == st->cap_pools) {
        size_t cap = st->cap_pools ? 2 * st->cap_pools : 4;
        ac_pool_slot *p = realloc(st->pool_slots, cap * sizeof(*p));
        if (p == NULL) {
            ac_unlock(st);
            PyErr_NoMemory();
            goto done;
        }
        st->pool_slots = p;
        st->cap_pools = cap;
    }
    if (PyList_Append(st->pools, pool) < 0) {
        ac_unlock(st);
        goto done;
    }
    if (PyList_Append(st->pool_ids, *id) < 0) {
        (void)PyList_SetSlice(st->pools, PyList_GET_SIZE(st->pools) - 1,
                              PyList_GET_SIZE(st->pools), NULL);
        ac_unlock(st);
        goto done;
    }
    st->pool_slots[st->n_pools] = (ac_pool_slot){device, 1};
    *slot = st->n_pools++;
    ac_unlock(st);
    rc = 0;
done:
    if (rc < 0) {
        Py_CLEAR(*id);
    }
    Py_XDECREF(pool);
    return rc;
}

/* End the routes `slots` of one thread and give their pools back.  Runs
 * torch's code: without the lock.  0, or -1 with the first of torch's
 * exceptions set (every route is ended all the same). */
static int
end_routes(ac_state *st, PyObject *api, const size_t *slots, size_t n)
{
    PyObject *exc = NULL;
    size_t i;

    for (i = 0; i < n; i++) {
        PyObject *id;
        int device;

        if (ac_lock(st) < 0) {
            break;
        }
        device = st->pool_slots[slots[i]].device;
        id = Py_NewRef(PyList_GET_ITEM(st->pool_ids, (Py_ssize_t)slots[i]));
        ac_unlock(st);
        if (ac_pools_end(api, device, id) < 0 && exc == NULL) {
            exc = PyErr_GetRaisedException();
        }
        PyErr_Clear();
        Py_DECREF(id);
        if (ac_lock(st) == 0) {
            st->pool_slots[slots[i]].busy = 0;
            ac_unlock(st);
        }
    }
    if (exc != NULL) {
        PyErr_SetRaisedException(exc);
        return -1;
    }
    return PyErr_Occurred() ? -1 : 0;
}

/* ------------------------------------------------------------------ */
/* Opening and closing                                                  */
/* ------------------------------------------------------------------ */

/* Open a window held process-wide, counted as held by thread `me`. */
static int
hold(ac_state *st, unsigned long me)
{
    ac_opener *o;

    if (ac_window(st, 0, 1) < 0) {
        return -1;
    }
    /* ac_window left an entry for `me`, so this finds it. */
    if (ac_lock(st) < 0) {
        return -1;
    }
    o = ac_opener_of(st, me);
    if (o != NULL) {
        o->held++;
    }
    ac_unlock(st);
    return 0;
}

/* Open the outermost routed window of thread `me`.  0, or -1 with an
 * exception set and every route begun here ended. */
static int
route(ac_state *st, unsigned long me, PyObject *api)
{
    size_t slots[AC_MAX_DEVICES], n = 0;
    unsigned long long devices;
    int device, d;
    ac_opener *o;
    size_t *grown;

    device = ac_pools_current_device(api);
    if (device < 0) {
        return -1;
    }
    devices = cu_active_devices();
    if (device < AC_MAX_DEVICES) {
        devices |= 1ULL << device;
    }
    for (d = 0; d < AC_MAX_DEVICES; d++) {
        PyObject *id = NULL;
        if (!(devices & (1ULL << d))) {
            continue;
        }
        if (take_pool(st, api, d, &slots[n], &id) < 0) {
            goto undo;
        }
        if (ac_pools_begin(api, d, id) < 0) {
            Py_DECREF(id);
            if (ac_lock(st) == 0) {
                st->pool_slots[slots[n]].busy = 0;
                ac_unlock(st);
            }
            goto undo;
        }
        Py_DECREF(id);
        n++;
    }
    if (ac_lock(st) < 0) {
        goto undo;
    }
    o = ac_opener_of(st, me);
    /* Another window of this thread may have opened while torch ran
     * (a finalizer): its routes and these are ended together. */
    grown =
        o ? realloc(o->routes, (o->n_routes + n + 1) * sizeof(size_t)) : NULL;
    if (grown == NULL) {
        if (o != NULL) {
            ac_opener_tidy(st, o);
        }
        ac_unlock(st);
        PyErr_NoMemory();
        goto undo;
    }
    o->routes = grown;
    memcpy(o->routes + o->n_routes, slots, n * sizeof(size_t));
    o->n_routes += n;
    o->routed++;
    ac_unlock(st);
    return 0;
undo : {
    PyObject *exc = PyErr_GetRaisedException();
    (void)end_routes(st, api, slots, n);
    PyErr_Clear();
    PyErr_SetRaisedException(exc);
    return -1;
}
}

static int
scoped_enter(ac_state *st)
{
    unsigned long me = PyThread_get_thread_ident();
    PyObject *api = NULL;
    ac_opener *o;
    int up, rc = -1;

    if (ac_lock(st) < 0) {
        return -1;
    }
    o = ac_opener_of(st, me);
    if (o == NULL) {
        ac_unlock(st);
        PyErr_NoMemory();
        return -1;
    }
    if (o->routed > 0) { /* nested: the routes are in place */
        o->routed++;
        ac_unlock(st);
        return 0;
    }
    if (o->held == 0 && st->pool_api != NULL) {
        api = Py_NewRef(st->pool_api);
    }
    ac_opener_tidy(st, o);
    ac_unlock(st);
    if (api == NULL) { /* nested in a held window, or no pools */
        return hold(st, me);
    }
    up = ac_pools_cuda_up(api);
    if (up >= 0) {
        rc = up ? route(st, me, api) : hold(st, me);
    }
    Py_DECREF(api);
    return rc;
}

/* The entry of `me` if it has a window of the opener's scope open, else
 * any thread's that has (a window closed by another thread than the one
 * that opened it); NULL when none has. */
static ac_opener *
scoped_closer(ac_state *st, unsigned long me)
{
    ac_opener *any = NULL;
    size_t i;
    for (i = 0; i < st->n_openers; i++) {
        ac_opener *o = &st->openers[i];
        if (o->routed == 0 && o->held == 0) {
            continue;
        }
        if (o->thread == me) {
            return o;
        }
        any = any ? any : o;
    }
    return any;
}

static int
scoped_exit(ac_state *st)
{
    unsigned long me = PyThread_get_thread_ident();
    PyObject *api = NULL;
    size_t *routes = NULL, n = 0;
    ac_opener *o;
    int rc;

    if (ac_lock(st) < 0) {
        return -1;
    }
    o = scoped_closer(st, me);
    if (o == NULL) {
        ac_unlock(st);
        PyErr_SetString(PyExc_RuntimeError,
                        "allocconf: an ipc_safe() window was closed more "
                        "often than it was opened");
        return -1;
    }
    if (o->routed == 0) { /* held process-wide */
        o->held--;
        ac_opener_tidy(st, o);
        ac_unlock(st);
        return ac_window(st, 0, 0);
    }
    if (--o->routed == 0) {
        routes = o->routes;
        n = o->n_routes;
        o->routes = NULL;
        o->n_routes = 0;
        api = Py_XNewRef(st->pool_api);
    }
    ac_opener_tidy(st, o);
    ac_unlock(st);
    if (routes == NULL) {
        return 0;
    }
    rc = api ? end_routes(st, api, routes, n) : 0;
    Py_XDECREF(api);
    free(routes);
    return rc;
}

int
ac_scoped_window(ac_state *st, int enter)
{
    return enter ? scoped_enter(st) : scoped_exit(st);
}

/* ------------------------------------------------------------------ */
/* Set-up and status                                                    */
/* ------------------------------------------------------------------ */

int
ac_set_pools(ac_state *st, PyObject *api, PyObject *why)
{
    PyObject *pools = NULL, *ids = NULL;
    int rc = -1;

    if (api != Py_None &&
        (!PyTuple_Check(api) || PyTuple_GET_SIZE(api) != 6)) {
        PyErr_SetString(PyExc_TypeError,
                        "allocconf: the pool routing must be a 6-tuple");
        return -1;
    }
    if (!PyUnicode_CheckExact(why)) {
        PyErr_SetString(PyExc_TypeError,
                        "allocconf: the scope's reason must be a str");
        return -1;
    }
    pools = PyList_New(0);
    ids = PyList_New(0);
    if (pools == NULL || ids == NULL || ac_lock(st) < 0) {
        goto done;
    }
    Py_XSETREF(st->pool_api, api == Py_None ? NULL : Py_NewRef(api));
    Py_XSETREF(st->scope_why, Py_NewRef(why));
    if (st->pools == NULL) { /* kept across a second attach */
        st->pools = Py_NewRef(pools);
        st->pool_ids = Py_NewRef(ids);
    }
    ac_unlock(st);
    rc = 0;
done:
    Py_XDECREF(pools);
    Py_XDECREF(ids);
    return rc;
}

int
ac_release_pools(ac_state *st)
{
    PyObject *pools = NULL, *ids = NULL, *fresh = NULL, *fresh_ids = NULL;
    size_t i;

    fresh = PyList_New(0);
    fresh_ids = PyList_New(0);
    if (fresh == NULL || fresh_ids == NULL || ac_lock(st) < 0) {
        Py_XDECREF(fresh);
        Py_XDECREF(fresh_ids);
        return -1;
    }
    for (i = 0; i < st->n_pools; i++) {
        if (st->pool_slots[i].busy) {
            ac_unlock(st);
            Py_DECREF(fresh);
            Py_DECREF(fresh_ids);
            PyErr_SetString(PyExc_RuntimeError,
                            "allocconf.release_pools: an ipc_safe() window "
                            "routes to a pool now; call it once every "
                            "window has closed");
            return -1;
        }
    }
    pools = st->pools;
    ids = st->pool_ids;
    st->pools = fresh;
    st->pool_ids = fresh_ids;
    st->n_pools = 0;
    ac_unlock(st);
    /* The pools end here, without the lock: torch gives their free
     * blocks back to the device (the pool object's end). */
    Py_XDECREF(pools);
    Py_XDECREF(ids);
    return PyErr_Occurred() ? -1 : 0;
}

PyObject *
ac_scope_locked(const ac_state *st)
{
    return PyUnicode_FromString(st->pool_api ? "opener" : "process");
}

PyObject *
ac_scope_reason_locked(const ac_state *st)
{
    if (st->scope_why != NULL) {
        return Py_NewRef(st->scope_why);
    }
    return PyUnicode_FromString(
        "torch is not imported yet: a window holds expandable segments off "
        "for the whole process until it is");
}

Py_ssize_t
ac_routed_locked(const ac_state *st)
{
    Py_ssize_t n = 0;
    size_t i;
    for (i = 0; i < st->n_openers; i++) {
        n += st->openers[i].routed;
    }
    return n;
}
