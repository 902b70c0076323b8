/*
 * conf.c -- tokenise, parse, validate, set and serialise allocator
 * configuration strings (see conf.h).
 *
 * The tokeniser mirrors PyTorch's ConfigTokenizer: ',' ':' '[' ']' are
 * tokens of their own and whitespace is dropped, even inside a word.  The
 * parser is stricter than PyTorch's where PyTorch would silently misread
 * (a negative size, "64.5" read as 64, a stray ']'), so that a mistake is
 * reported here, with its offset, rather than at the first CUDA
 * allocation.
 */
#include "conf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Errors                                                               */
/* ------------------------------------------------------------------ */

/* Copy at most AC_ERR_TEXT-1 bytes of src[0:n] into dst, marking a cut
 * with "...". */
static void
copy_clipped(char *dst, const char *src, size_t n)
{
    if (n < AC_ERR_TEXT) {
        memcpy(dst, src, n);
        dst[n] = '\0';
        return;
    }
    memcpy(dst, src, AC_ERR_TEXT - 4);
    memcpy(dst + AC_ERR_TEXT - 4, "...", 4);
}

/* Fill *err; always returns -1 so callers can `return fail(...)`. */
static int
fail(ac_error *err, const char *key, size_t offset, const char *text,
     size_t text_len, const char *fmt, ...)
{
    va_list ap;

    memset(err, 0, sizeof(*err));
    err->offset = offset;
    if (key != NULL) {
        copy_clipped(err->key, key, strlen(key));
    }
    if (text != NULL) {
        copy_clipped(err->text, text, text_len);
    }
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return -1;
}

static int
fail_nomem(ac_error *err)
{
    memset(err, 0, sizeof(*err));
    err->nomem = 1;
    snprintf(err->message, sizeof(err->message), "out of memory");
    return -1;
}

/* ------------------------------------------------------------------ */
/* Tokeniser                                                            */
/* ------------------------------------------------------------------ */

/* A token: a separator (sep != 0) or a word, whose text (whitespace
 * removed) starts at text within the tokeniser's buffer. */
typedef struct {
    char sep;
    size_t offset;
    char *text;
    size_t len;
} token;

typedef struct {
    token *tok;
    size_t n;
    char *buf; /* word texts, each NUL-terminated */
} tokens;

static void
tokens_free(tokens *t)
{
    free(t->tok);
    free(t->buf);
    t->tok = NULL;
    t->buf = NULL;
    t->n = 0;
}

static int
is_space(unsigned char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

static int
is_sep(unsigned char c)
{
    return c == ',' || c == ':' || c == '[' || c == ']';
}

/* Split s[0:n] into tokens.  Returns 0, or -1 with *err filled. */
static int
tokenise(const char *s, size_t n, tokens *t, ac_error *err)
{
    size_t i, ntok = 0, pos = 0;
    int in_word = 0;

    /* At most one token per byte, and each word needs its bytes plus a
     * NUL: n + 1 bytes of text and n tokens cover every input. */
    t->tok = malloc((n ? n : 1) * sizeof(token));
    t->buf = malloc(2 * n + 1);
    t->n = 0;
    if (t->tok == NULL || t->buf == NULL) {
        tokens_free(t);
        return fail_nomem(err);
    }
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c == '\0') {
            tokens_free(t);
            return fail(err, NULL, i, NULL, 0,
                        "NUL character in the configuration");
        }
        if (c >= 0x7f || (c < 0x20 && !is_space(c))) {
            tokens_free(t);
            return fail(err, NULL, i, NULL, 0,
                        "byte 0x%02x is not printable ASCII", c);
        }
        if (is_space(c)) {
            continue; /* dropped, as PyTorch does, even inside a word */
        }
        if (is_sep(c)) {
            if (in_word) {
                t->buf[pos++] = '\0';
                in_word = 0;
            }
            t->tok[ntok].sep = (char)c;
            t->tok[ntok].offset = i;
            t->tok[ntok].text = NULL;
            t->tok[ntok].len = 1;
            ntok++;
            continue;
        }
        if (!in_word) {
            t->tok[ntok].sep = 0;
            t->tok[ntok].offset = i;
            t->tok[ntok].text = t->buf + pos;
            t->tok[ntok].len = 0;
            ntok++;
            in_word = 1;
        }
        t->buf[pos++] = (char)c;
        t->tok[ntok - 1].len++;
    }
    if (in_word) {
        t->buf[pos++] = '\0';
    }
    t->n = ntok;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Values                                                               */
/* ------------------------------------------------------------------ */

/* Parse an unsigned decimal integer made of digits only.  Returns 0 and
 * sets *out, -1 for a malformed number, -2 when it exceeds 64 bits. */
static int
parse_uint(const char *s, uint64_t *out)
{
    uint64_t v = 0;

    if (*s == '\0') {
        return -1;
    }
    for (; *s; s++) {
        unsigned d;
        if (*s < '0' || *s > '9') {
            return -1;
        }
        d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) {
            return -2;
        }
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static int
is_pow2(uint64_t v)
{
    return v != 0 && (v & (v - 1)) == 0;
}

/* Classify a plain decimal "D+(.D*)?" or ".D+" without floating point, so
 * that no locale can change the answer.  Returns -1 when malformed, else
 * 0 for a value of zero, 1 for 0 < x < 1, 2 for exactly 1, 3 for x > 1. */
static int
classify_decimal(const char *s)
{
    const char *p = s, *significant = NULL;
    size_t int_len = 0, digits = 0;
    int frac_nonzero = 0;

    /* The integer part, leading zeros skipped: empty, "1", or more. */
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (significant == NULL && *p != '0') {
            significant = p;
        }
        if (significant != NULL) {
            int_len++;
        }
    }
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, digits++) {
            frac_nonzero |= (*p != '0');
        }
    }
    if (*p != '\0' || digits == 0) {
        return -1;
    }
    if (int_len == 0) {
        return frac_nonzero ? 1 : 0;
    }
    return (int_len == 1 && *significant == '1' && !frac_nonzero) ? 2 : 3;
}

typedef enum {
    V_ANY,      /* unknown key: any word or list */
    V_BOOL,     /* exactly True or False */
    V_UINT_MIN, /* integer >= arg */
    V_UINT_GT,  /* integer > arg */
    V_OPEN01,   /* decimal, 0 < x < 1 */
    V_CLOSED01, /* decimal, 0 <= x <= 1 */
    V_POW2_MAX, /* power of two <= arg */
    V_ROUNDUP,  /* power of two, or [interval:divisions,...] */
    V_BACKEND,  /* native | cudaMallocAsync | hipMallocAsync */
} value_kind;

typedef struct {
    const char *name;
    value_kind kind;
    uint64_t arg;
} known_key;

/* PyTorch 2.14's keys (c10 AcceleratorAllocatorConfig and
 * CUDAAllocatorConfig), with the HIP spellings it accepts. */
static const known_key KNOWN_KEYS[] = {
    {"max_split_size_mb", V_UINT_MIN, 20},
    {"max_non_split_rounding_mb", V_UINT_MIN, 20},
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

static const known_key *
find_known(const char *key)
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
ac_key_is_known(const char *key)
{
    return find_known(key) != NULL;
}

/* Check one scalar word against its key's rule.  Returns 0, or -1 with
 * *err filled. */
static int
check_scalar(const char *key, const known_key *k, const token *w,
             ac_error *err)
{
    uint64_t v = 0;
    int rc;

    switch (k ? k->kind : V_ANY) {
    case V_ANY:
        return 0;
    case V_BOOL:
        if (strcmp(w->text, "True") == 0 || strcmp(w->text, "False") == 0) {
            return 0;
        }
        return fail(err, key, w->offset, w->text, w->len,
                    "expected True or False (exactly), got '%s'", w->text);
    case V_UINT_MIN:
    case V_UINT_GT:
    case V_POW2_MAX:
        rc = parse_uint(w->text, &v);
        if (rc == -2) {
            return fail(err, key, w->offset, w->text, w->len,
                        "integer out of range");
        }
        if (rc < 0) {
            return fail(err, key, w->offset, w->text, w->len,
                        "expected a non-negative integer, got '%s'", w->text);
        }
        if (k->kind == V_UINT_MIN && v < k->arg) {
            return fail(err, key, w->offset, w->text, w->len,
                        "must be >= %llu, got %llu",
                        (unsigned long long)k->arg, (unsigned long long)v);
        }
        if (k->kind == V_UINT_GT && v <= k->arg) {
            return fail(err, key, w->offset, w->text, w->len,
                        "must be > %llu, got %llu", (unsigned long long)k->arg,
                        (unsigned long long)v);
        }
        if (k->kind == V_POW2_MAX && (!is_pow2(v) || v > k->arg)) {
            return fail(err, key, w->offset, w->text, w->len,
                        "must be a power of two <= %llu, got %llu",
                        (unsigned long long)k->arg, (unsigned long long)v);
        }
        return 0;
    case V_OPEN01:
    case V_CLOSED01:
        rc = classify_decimal(w->text);
        if (rc < 0) {
            return fail(err, key, w->offset, w->text, w->len,
                        "expected a plain decimal number, got '%s'", w->text);
        }
        if (k->kind == V_OPEN01 && rc != 1) {
            return fail(err, key, w->offset, w->text, w->len,
                        "must be between 0 and 1 (exclusive), got %s",
                        w->text);
        }
        if (k->kind == V_CLOSED01 && rc > 2) {
            return fail(err, key, w->offset, w->text, w->len,
                        "must be between 0 and 1 (inclusive), got %s",
                        w->text);
        }
        return 0;
    case V_ROUNDUP:
        rc = parse_uint(w->text, &v);
        if (rc == 0 && is_pow2(v)) {
            return 0;
        }
        return fail(err, key, w->offset, w->text, w->len,
                    "expected a power of two or a list "
                    "[interval:divisions,...], got '%s'",
                    w->text);
    case V_BACKEND:
        if (strcmp(w->text, "native") == 0 ||
            strcmp(w->text, "cudaMallocAsync") == 0 ||
            strcmp(w->text, "hipMallocAsync") == 0) {
            return 0;
        }
        return fail(err, key, w->offset, w->text, w->len,
                    "expected native, cudaMallocAsync or hipMallocAsync, "
                    "got '%s'",
                    w->text);
    }
    return 0;
}

/* Check one roundup_power2_divisions list item "interval:divisions". */
static int
check_roundup_item(const char *key, const token *a, const token *b,
                   ac_error *err)
{
    uint64_t v = 0;
    int rc;

    if (b == NULL) {
        return fail(err, key, a->offset, a->text, a->len,
                    "expected interval:divisions in the list, got '%s'",
                    a->text);
    }
    if (strcmp(a->text, ">") != 0) {
        rc = parse_uint(a->text, &v);
        if (rc != 0 || !is_pow2(v)) {
            return fail(err, key, a->offset, a->text, a->len,
                        "interval must be a power of two or '>', got '%s'",
                        a->text);
        }
    }
    rc = parse_uint(b->text, &v);
    if (rc != 0 || (v != 0 && !is_pow2(v))) {
        return fail(err, key, b->offset, b->text, b->len,
                    "divisions must be 0 or a power of two, got '%s'",
                    b->text);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Parser                                                               */
/* ------------------------------------------------------------------ */

/* A growable string for building canonical values. */
typedef struct {
    char *s;
    size_t len;
    size_t cap;
} sbuf;

static int
sbuf_add(sbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        char *p;
        while (cap < b->len + n + 1) {
            cap *= 2;
        }
        p = realloc(b->s, cap);
        if (p == NULL) {
            return -1;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
    return 0;
}

static const char *
describe(const tokens *t, size_t i)
{
    if (i >= t->n) {
        return "the end of the string";
    }
    return t->tok[i].sep ? NULL : t->tok[i].text;
}

/* Fill *err for "expected X" at token i (or at the end, offset `end`). */
static int
fail_expected(ac_error *err, const char *key, const tokens *t, size_t i,
              size_t end, const char *what)
{
    const char *got = describe(t, i);
    if (i >= t->n) {
        return fail(err, key, end, NULL, 0, "expected %s, got %s", what, got);
    }
    if (got == NULL) {
        char sep[2] = {t->tok[i].sep, '\0'};
        return fail(err, key, t->tok[i].offset, sep, 1,
                    "expected %s, got '%c'", what, t->tok[i].sep);
    }
    return fail(err, key, t->tok[i].offset, got, t->tok[i].len,
                "expected %s, got '%s'", what, got);
}

static int
is_key_name(const char *s)
{
    for (; *s; s++) {
        char c = *s;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_')) {
            return 0;
        }
    }
    return 1;
}

/* Parse the value that starts at token *i for `key` (the token after the
 * ':').  On success *i is the value's last token and *norm a malloc'd
 * canonical value.  `end` is the offset to report at the end of input. */
static int
parse_value(const tokens *t, size_t *i, size_t end, const char *key,
            char **norm, ac_error *err)
{
    const known_key *k = find_known(key);
    sbuf b = {NULL, 0, 0};
    size_t j = *i;

    if (j >= t->n || (t->tok[j].sep && t->tok[j].sep != '[')) {
        return fail_expected(err, key, t, j, end, "a value");
    }
    if (!t->tok[j].sep) {
        if (check_scalar(key, k, &t->tok[j], err) < 0) {
            return -1;
        }
        *norm = malloc(t->tok[j].len + 1);
        if (*norm == NULL) {
            return fail_nomem(err);
        }
        memcpy(*norm, t->tok[j].text, t->tok[j].len + 1);
        return 0;
    }
    /* A list: '[' (item (',' item)* ','?)? ']', item = word (':' word)? */
    if (k != NULL && k->kind != V_ROUNDUP && k->kind != V_ANY) {
        return fail(err, key, t->tok[j].offset, "[", 1,
                    "takes a single value, not a list");
    }
    if (sbuf_add(&b, "[", 1) < 0) {
        goto nomem;
    }
    j++;
    while (j < t->n && t->tok[j].sep != ']') {
        const token *a = &t->tok[j], *v = NULL;
        if (a->sep) {
            fail_expected(err, key, t, j, end, "a list item");
            goto error;
        }
        if (j + 1 < t->n && t->tok[j + 1].sep == ':') {
            if (j + 2 >= t->n || t->tok[j + 2].sep) {
                fail_expected(err, key, t, j + 2, end, "a value after ':'");
                goto error;
            }
            v = &t->tok[j + 2];
            j += 2;
        }
        if (k != NULL && k->kind == V_ROUNDUP &&
            check_roundup_item(key, a, v, err) < 0) {
            goto error;
        }
        if ((b.len > 1 && sbuf_add(&b, ",", 1) < 0) ||
            sbuf_add(&b, a->text, a->len) < 0 ||
            (v && (sbuf_add(&b, ":", 1) < 0 ||
                   sbuf_add(&b, v->text, v->len) < 0))) {
            goto nomem;
        }
        j++;
        if (j < t->n && t->tok[j].sep == ',') {
            j++;
        }
        else if (j < t->n && t->tok[j].sep != ']') {
            fail_expected(err, key, t, j, end, "',' or ']' in the list");
            goto error;
        }
    }
    if (j >= t->n) {
        fail(err, key, end, NULL, 0, "unclosed '[': expected ']'");
        goto error;
    }
    if (sbuf_add(&b, "]", 1) < 0) {
        goto nomem;
    }
    *i = j;
    *norm = b.s;
    return 0;

nomem:
    fail_nomem(err);
error:
    free(b.s);
    return -1;
}

static int
conf_append(ac_conf *c, char *key, char *value, size_t key_offset,
            size_t value_offset)
{
    if (c->len == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        ac_entry *p = realloc(c->items, cap * sizeof(ac_entry));
        if (p == NULL) {
            return -1;
        }
        c->items = p;
        c->cap = cap;
    }
    c->items[c->len].key = key;
    c->items[c->len].value = value;
    c->items[c->len].key_offset = key_offset;
    c->items[c->len].value_offset = value_offset;
    c->len++;
    return 0;
}

static char *
dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p != NULL) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* Rules between keys.  torch checks max_split_size_mb and
 * max_non_split_rounding_mb against the large segment size (20 MB unless
 * large_segment_size_mb says otherwise); it reads the keys in order, but
 * allocconf may append keys, so the check here does not depend on order.
 * Returns 0, or -1 with *err filled. */
static int
check_relations(const ac_conf *c, ac_error *err)
{
    const char *large = ac_conf_get(c, "large_segment_size_mb");
    uint64_t min = 20, v;
    size_t i;

    if (large != NULL && parse_uint(large, &v) == 0 && v > min) {
        min = v;
    }
    for (i = 0; i < c->len; i++) {
        const ac_entry *e = &c->items[i];
        if ((strcmp(e->key, "max_split_size_mb") == 0 ||
             strcmp(e->key, "max_non_split_rounding_mb") == 0) &&
            parse_uint(e->value, &v) == 0 && v < min) {
            return fail(err, e->key, e->value_offset, e->value,
                        strlen(e->value),
                        "must be >= large_segment_size_mb (%llu), got %llu",
                        (unsigned long long)min, (unsigned long long)v);
        }
    }
    return 0;
}

int
ac_conf_parse(const char *s, size_t n, ac_conf *out, ac_error *err)
{
    tokens t = {NULL, 0, NULL};
    size_t i = 0;

    if (tokenise(s, n, &t, err) < 0) {
        return -1;
    }
    while (i < t.n) {
        const token *k = &t.tok[i];
        char *key = NULL, *value = NULL;
        size_t value_offset;

        if (k->sep) {
            fail_expected(err, NULL, &t, i, n, "a key");
            goto error;
        }
        if (!is_key_name(k->text)) {
            fail(err, k->text, k->offset, k->text, k->len,
                 "'%s' is not a key name (letters, digits and '_')", k->text);
            goto error;
        }
        if (i + 1 >= t.n || t.tok[i + 1].sep != ':') {
            fail_expected(err, k->text, &t, i + 1, n, "':' after the key");
            goto error;
        }
        i += 2;
        value_offset = i < t.n ? t.tok[i].offset : n;
        if (parse_value(&t, &i, n, k->text, &value, err) < 0) {
            goto error;
        }
        key = dup_n(k->text, k->len);
        if (key == NULL ||
            conf_append(out, key, value, k->offset, value_offset) < 0) {
            free(key);
            free(value);
            fail_nomem(err);
            goto error;
        }
        i++;
        if (i < t.n) {
            if (t.tok[i].sep != ',') {
                fail_expected(err, k->text, &t, i, n, "',' after the value");
                goto error;
            }
            i++; /* a trailing ',' is accepted, as PyTorch does */
        }
    }
    tokens_free(&t);
    if (check_relations(out, err) < 0) {
        ac_conf_clear(out);
        return -1;
    }
    return 0;

error:
    tokens_free(&t);
    ac_conf_clear(out);
    return -1;
}

int
ac_value_parse(const char *key, const char *value, char **norm, ac_error *err)
{
    tokens t = {NULL, 0, NULL};
    size_t i = 0, n = strlen(value);

    *norm = NULL;
    if (!is_key_name(key) || *key == '\0') {
        return fail(err, key, 0, key, strlen(key),
                    "'%s' is not a key name (letters, digits and '_')", key);
    }
    if (tokenise(value, n, &t, err) < 0) {
        copy_clipped(err->key, key, strlen(key));
        return -1;
    }
    if (parse_value(&t, &i, n, key, norm, err) < 0) {
        tokens_free(&t);
        return -1;
    }
    if (i + 1 < t.n) {
        fail_expected(err, key, &t, i + 1, n, "the end of the value");
        free(*norm);
        *norm = NULL;
        tokens_free(&t);
        return -1;
    }
    tokens_free(&t);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Editing and output                                                   */
/* ------------------------------------------------------------------ */

static void
entry_free(ac_entry *e)
{
    free(e->key);
    free(e->value);
}

int
ac_conf_set(ac_conf *c, const char *key, const char *value)
{
    size_t i, w;
    int found = 0;

    for (i = 0, w = 0; i < c->len; i++) {
        ac_entry e = c->items[i];
        if (strcmp(e.key, key) == 0) {
            if (value != NULL && !found) {
                char *v = dup_n(value, strlen(value));
                if (v == NULL) {
                    /* Nothing moved yet past w == i: undo is a no-op. */
                    for (; i < c->len; i++) {
                        c->items[w++] = c->items[i];
                    }
                    c->len = w;
                    return -1;
                }
                free(e.value);
                e.value = v;
                found = 1;
                c->items[w++] = e;
                continue;
            }
            entry_free(&e);
            continue;
        }
        c->items[w++] = e;
    }
    c->len = w;
    if (value != NULL && !found) {
        char *k = dup_n(key, strlen(key));
        char *v = dup_n(value, strlen(value));
        if (k == NULL || v == NULL || conf_append(c, k, v, 0, 0) < 0) {
            free(k);
            free(v);
            return -1;
        }
    }
    return 0;
}

const char *
ac_conf_get(const ac_conf *c, const char *key)
{
    size_t i = c->len;
    while (i-- > 0) {
        if (strcmp(c->items[i].key, key) == 0) {
            return c->items[i].value;
        }
    }
    return NULL;
}

char *
ac_conf_serialise(const ac_conf *c, const char *skip_key)
{
    sbuf b = {NULL, 0, 0};
    size_t i;

    if (sbuf_add(&b, "", 0) < 0) {
        return NULL;
    }
    for (i = 0; i < c->len; i++) {
        const ac_entry *e = &c->items[i];
        if (skip_key != NULL && strcmp(e->key, skip_key) == 0) {
            continue;
        }
        if ((b.len > 0 && sbuf_add(&b, ",", 1) < 0) ||
            sbuf_add(&b, e->key, strlen(e->key)) < 0 ||
            sbuf_add(&b, ":", 1) < 0 ||
            sbuf_add(&b, e->value, strlen(e->value)) < 0) {
            free(b.s);
            return NULL;
        }
    }
    return b.s;
}

int
ac_conf_copy(ac_conf *dst, const ac_conf *src)
{
    size_t i;
    for (i = 0; i < src->len; i++) {
        const ac_entry *e = &src->items[i];
        char *k = dup_n(e->key, strlen(e->key));
        char *v = dup_n(e->value, strlen(e->value));
        if (k == NULL || v == NULL ||
            conf_append(dst, k, v, e->key_offset, e->value_offset) < 0) {
            free(k);
            free(v);
            ac_conf_clear(dst);
            return -1;
        }
    }
    return 0;
}

void
ac_conf_clear(ac_conf *c)
{
    size_t i;
    for (i = 0; i < c->len; i++) {
        entry_free(&c->items[i]);
    }
    free(c->items);
    c->items = NULL;
    c->len = 0;
    c->cap = 0;
}
