/*
 * keys.c -- the keys PyTorch's allocator knows and the rules for their
 * values, numbers read exactly as torch reads them.
 *
 * torch reads integers with std::stoull and fractions with std::stod: an
 * optional sign, then as much of the word as makes a number, the rest
 * ignored ("64abc" is 64, "-1" wraps to 2^64 - 1, "4." is 4); no digits at
 * all, or a value out of range (an overflow, or a fraction that underflows
 * to a subnormal), is an error.  allocconf calls the same C library
 * functions (strtoull, strtod), so it accepts and refuses what torch does,
 * in the same locale; tests/test_differential.py holds it to that against
 * torch's own setter.
 */
#include "grammar/keys.h"
#include "grammar/text.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The largest size in MB torch keeps: SIZE_MAX / 1 MiB (it clamps). */
#define MAX_MB (UINT64_MAX / (1024u * 1024u))

/* large_segment_size_mb when nothing sets it: 20 MB (kLargeBuffer). */
#define LARGE_SEGMENT_DEFAULT_MB 20u

/* ------------------------------------------------------------------ */
/* Numbers                                                              */
/* ------------------------------------------------------------------ */

/* How a strtoull/strtod call that started at s and stopped at end went:
 * 0, -1 when it read no number, -2 when out of range (errno ERANGE). */
static int
conversion(const char *s, const char *end)
{
    if (end == s) {
        return -1;
    }
    return errno == ERANGE ? -2 : 0;
}

/* An integer as std::stoull reads it: 0 with *out set, or as
 * conversion() says. */
static int
read_uint(const char *s, uint64_t *out)
{
    char *end;

    errno = 0;
    *out = (uint64_t)strtoull(s, &end, 10);
    return conversion(s, end);
}

/* A fraction as std::stod reads it (overflow and underflow out of
 * range): 0 with *out set, or as conversion() says. */
static int
read_double(const char *s, double *out)
{
    char *end;

    errno = 0;
    *out = strtod(s, &end);
    return conversion(s, end);
}

static int
is_pow2(uint64_t v)
{
    return v != 0 && (v & (v - 1)) == 0;
}

/* Fill *err for a word that read_uint/read_double refused (rc -1 or
 * -2). */
static int
fail_number(ac_error *err, const char *key, const ac_token *w, int rc)
{
    if (rc == -2) {
        return ac_fail(err, key, w->offset, w->text, w->len,
                       "number out of range, got '%s'", w->text);
    }
    return ac_fail(err, key, w->offset, w->text, w->len,
                   "expected a number, got '%s'", w->text);
}

/* ------------------------------------------------------------------ */
/* The keys                                                             */
/* ------------------------------------------------------------------ */

typedef enum {
    V_BOOL,     /* exactly True or False */
    V_UINT,     /* any integer (the rules between keys may say more) */
    V_UINT_MIN, /* integer >= arg */
    V_UINT_GT,  /* integer > arg */
    V_OPEN01,   /* fraction, 0 < x < 1 */
    V_CLOSED01, /* fraction, 0 <= x <= 1 */
    V_POW2_MAX, /* power of two <= arg */
    V_ROUNDUP,  /* power of two, or [interval:divisions,...] */
    V_BACKEND,  /* native | cudaMallocAsync | hipMallocAsync */
} value_kind;

struct ac_key_rule {
    const char *name;
    value_kind kind;
    uint64_t arg;
};

/* PyTorch 2.14's keys (c10 AcceleratorAllocatorConfig and
 * CUDAAllocatorConfig), with the HIP spellings it accepts.
 * max_split_size_mb and max_non_split_rounding_mb are bounded by the
 * large segment size: see ac_check_relations. */
static const ac_key_rule KNOWN_KEYS[] = {
    {"max_split_size_mb", V_UINT, 0},
    {"max_non_split_rounding_mb", V_UINT, 0},
    {"garbage_collection_threshold", V_OPEN01, 0},
    {"roundup_power2_divisions", V_ROUNDUP, 0},
    {"expandable_segments", V_BOOL, 0},
    {"large_segment_size_mb", V_UINT_GT, 10},
    {"pinned_use_background_threads", V_BOOL, 0},
    {"pinned_max_round_threshold_mb", V_UINT_MIN, 0},
    {"pinned_max_cached_size_mb", V_UINT_MIN, 0},
    {"backend", V_BACKEND, 0},
    {"release_lock_on_cudamalloc", V_BOOL, 0},
    {"release_lock_on_hipmalloc", V_BOOL, 0},
    {"pinned_use_cuda_host_register", V_BOOL, 0},
    {"pinned_use_hip_host_register", V_BOOL, 0},
    {"pinned_num_register_threads", V_POW2_MAX, 128},
    {"pinned_reserve_segment_size_mb", V_UINT_MIN, 1},
    {"graph_capture_record_stream_reuse", V_BOOL, 0},
    {"per_process_memory_fraction", V_CLOSED01, 0},
    {"pinned_free_catch_all", V_BOOL, 0},
    {"throw_on_cudamalloc_oom", V_BOOL, 0},
};

const ac_key_rule *
ac_rule(const char *key)
{
    size_t i;
    for (i = 0; i < sizeof(KNOWN_KEYS) / sizeof(KNOWN_KEYS[0]); i++) {
        if (strcmp(KNOWN_KEYS[i].name, key) == 0) {
            return &KNOWN_KEYS[i];
        }
    }
    return NULL;
}

int
ac_rule_takes_list(const ac_key_rule *k)
{
    return k == NULL || k->kind == V_ROUNDUP;
}

int
ac_rule_is_roundup(const ac_key_rule *k)
{
    return k != NULL && k->kind == V_ROUNDUP;
}

static int
check_uint(const char *key, const ac_key_rule *k, const ac_token *w,
           ac_error *err)
{
    uint64_t v = 0;
    int rc = read_uint(w->text, &v);

    if (rc < 0) {
        return fail_number(err, key, w, rc);
    }
    if (k->kind == V_UINT_MIN && v < k->arg) {
        return ac_fail(err, key, w->offset, w->text, w->len,
                       "must be >= %llu, got %s", (unsigned long long)k->arg,
                       w->text);
    }
    if (k->kind == V_UINT_GT && v <= k->arg) {
        return ac_fail(err, key, w->offset, w->text, w->len,
                       "must be > %llu, got %s", (unsigned long long)k->arg,
                       w->text);
    }
    if (k->kind == V_POW2_MAX && (!is_pow2(v) || v > k->arg)) {
        return ac_fail(err, key, w->offset, w->text, w->len,
                       "must be a power of two <= %llu, got %s",
                       (unsigned long long)k->arg, w->text);
    }
    return 0;
}

static int
check_fraction(const char *key, const ac_key_rule *k, const ac_token *w,
               ac_error *err)
{
    double v = 0;
    int rc = read_double(w->text, &v);

    if (rc < 0) {
        return fail_number(err, key, w, rc);
    }
    /* NaN fails both comparisons, as it does in torch. */
    if (k->kind == V_OPEN01 && !(v > 0 && v < 1)) {
        return ac_fail(err, key, w->offset, w->text, w->len,
                       "must be between 0 and 1 (exclusive), got %s "
                       "(read as %.17g)",
                       w->text, v);
    }
    if (k->kind == V_CLOSED01 && !(v >= 0 && v <= 1)) {
        return ac_fail(err, key, w->offset, w->text, w->len,
                       "must be between 0 and 1 (inclusive), got %s", w->text);
    }
    return 0;
}

int
ac_check_scalar(const char *key, const ac_key_rule *k, const ac_token *w,
                ac_error *err)
{
    uint64_t v = 0;
    int rc;

    if (k == NULL) {
        return 0;
    }
    switch (k->kind) {
    case V_BOOL:
        if (strcmp(w->text, "True") == 0 || strcmp(w->text, "False") == 0) {
            return 0;
        }
        return ac_fail(err, key, w->offset, w->text, w->len,
                       "expected True or False (exactly), got '%s'", w->text);
    case V_UINT:
    case V_UINT_MIN:
    case V_UINT_GT:
    case V_POW2_MAX:
        return check_uint(key, k, w, err);
    case V_OPEN01:
    case V_CLOSED01:
        return check_fraction(key, k, w, err);
    case V_ROUNDUP:
        rc = read_uint(w->text, &v);
        if (rc == 0 && is_pow2(v)) {
            return 0;
        }
        if (rc == -2) {
            return fail_number(err, key, w, rc);
        }
        return ac_fail(err, key, w->offset, w->text, w->len,
                       "expected a power of two or a list "
                       "[interval:divisions,...], got '%s'",
                       w->text);
    case V_BACKEND:
        if (strcmp(w->text, "native") == 0 ||
            strcmp(w->text, "cudaMallocAsync") == 0 ||
            strcmp(w->text, "hipMallocAsync") == 0) {
            return 0;
        }
        return ac_fail(err, key, w->offset, w->text, w->len,
                       "expected native, cudaMallocAsync or hipMallocAsync, "
                       "got '%s'",
                       w->text);
    }
    return 0;
}

int
ac_check_roundup_item(const char *key, const ac_token *a, const ac_token *b,
                      ac_error *err)
{
    uint64_t v = 0;
    int rc;

    if (b == NULL) {
        return ac_fail(err, key, a->offset, a->text, a->len,
                       "expected interval:divisions in the list, got '%s'",
                       a->text);
    }
    if (strcmp(a->text, ">") != 0) {
        rc = read_uint(a->text, &v);
        if (rc != 0 || !is_pow2(v)) {
            return ac_fail(err, key, a->offset, a->text, a->len,
                           "interval must be a power of two or '>', got '%s'",
                           a->text);
        }
    }
    rc = read_uint(b->text, &v);
    if (rc != 0 || (v != 0 && !is_pow2(v))) {
        return ac_fail(err, key, b->offset, b->text, b->len,
                       "divisions must be 0 or a power of two, got '%s'",
                       b->text);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Rules between keys                                                   */
/* ------------------------------------------------------------------ */

/* torch bounds max_split_size_mb and max_non_split_rounding_mb below by
 * the large segment size (its last value in the string, else 20 MB,
 * clamped to MAX_MB), whatever the order of the keys. */
int
ac_check_relations(const ac_conf *c, ac_error *err)
{
    const char *large = ac_conf_get(c, "large_segment_size_mb");
    uint64_t min = LARGE_SEGMENT_DEFAULT_MB, v;
    size_t i;

    if (large != NULL && read_uint(large, &v) == 0) {
        min = v < MAX_MB ? v : MAX_MB;
    }
    for (i = 0; i < c->len; i++) {
        const ac_entry *e = &c->items[i];
        if ((strcmp(e->key, "max_split_size_mb") == 0 ||
             strcmp(e->key, "max_non_split_rounding_mb") == 0) &&
            read_uint(e->value, &v) == 0 && v < min) {
            return ac_fail(
                err, e->key, e->value_offset, e->value, strlen(e->value),
                "must be >= the large segment size (%llu MB%s), "
                "got %s",
                (unsigned long long)min,
                large ? ", large_segment_size_mb" : " by default", e->value);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Sticky keys                                                          */
/* ------------------------------------------------------------------ */

/* The keys torch keeps when a write leaves them out (docs/design.md,
 * "What torch does with a write"), with the
 * value that gives torch's default back (NULL where none can), and
 * whether only torch with the 2.10 configuration knows the key: 2.6.0's
 * and 2.9.1's setters refuse large_segment_size_mb ("Unrecognized
 * CachingAllocator option"), so its default must never be written there. */
static const struct {
    const char *key;
    const char *dflt;
    int generic_only;
} STICKY[AC_NSTICKY] = {
    {"expandable_segments", "False", 0},
    {"large_segment_size_mb", "20", 1},
    {"expandable_segments_reserve", NULL, 1},
    {"expandable_segments_reserve_by_class", NULL, 1},
};

unsigned
ac_sticky_known(int generic)
{
    unsigned mask = 0;
    int i;

    for (i = 0; i < AC_NSTICKY; i++) {
        if (generic || !STICKY[i].generic_only) {
            mask |= 1u << i;
        }
    }
    return mask;
}

unsigned
ac_sticky_mask(const ac_conf *c)
{
    unsigned mask = 0;
    int i;

    for (i = 0; i < AC_NSTICKY; i++) {
        const char *v = ac_conf_get(c, STICKY[i].key);
        if (v == NULL) {
            continue;
        }
        mask |= 1u << i;
        if (STICKY[i].dflt == NULL || strcmp(v, STICKY[i].dflt) != 0) {
            mask |= 1u << (i + AC_NSTICKY);
        }
    }
    return mask;
}

const char *
ac_sticky_key(int i)
{
    return STICKY[i].key;
}

const char *
ac_sticky_default(int i)
{
    return STICKY[i].dflt;
}

int
ac_sticky_carry(ac_conf *dst, const ac_conf *from)
{
    int i;

    for (i = 0; i < AC_NSTICKY; i++) {
        const char *v = ac_conf_get(from, STICKY[i].key);
        if (v != NULL && ac_conf_get(dst, STICKY[i].key) == NULL &&
            ac_conf_set(dst, STICKY[i].key, v) < 0) {
            return -1;
        }
    }
    return 0;
}
