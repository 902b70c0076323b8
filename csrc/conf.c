/*
 * conf.c -- tokenise, parse, validate, set and serialise allocator
 * configuration strings (see conf.h).
 *
 * The tokeniser mirrors PyTorch's ConfigTokenizer: ',' ':' '[' ']' are
 * tokens of their own and whitespace is dropped, even inside a word.
 * Values are checked by the rules in keys.c, which read numbers as torch
 * does; what torch refuses is refused here first, with its offset, rather
 * than half-applied by torch's setter.
 */
#include "conf_impl.h"

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

/* See conf_impl.h. */
int
ac_fail(ac_error *err, const char *key, size_t offset, const char *text,
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

typedef struct {
    ac_token *tok;
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
    t->tok = malloc((n ? n : 1) * sizeof(ac_token));
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
            return ac_fail(err, NULL, i, NULL, 0,
                           "NUL character in the configuration");
        }
        if (c >= 0x7f || (c < 0x20 && !is_space(c))) {
            tokens_free(t);
            return ac_fail(err, NULL, i, NULL, 0,
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
        return ac_fail(err, key, end, NULL, 0, "expected %s, got %s", what,
                       got);
    }
    if (got == NULL) {
        char sep[2] = {t->tok[i].sep, '\0'};
        return ac_fail(err, key, t->tok[i].offset, sep, 1,
                       "expected %s, got '%c'", what, t->tok[i].sep);
    }
    return ac_fail(err, key, t->tok[i].offset, got, t->tok[i].len,
                   "expected %s, got '%s'", what, got);
}

int
ac_is_key_name(const char *s)
{
    if (*s == '\0') {
        return 0;
    }
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
    const ac_key_rule *k = ac_rule(key);
    sbuf b = {NULL, 0, 0};
    size_t j = *i;

    if (j >= t->n || (t->tok[j].sep && t->tok[j].sep != '[')) {
        return fail_expected(err, key, t, j, end, "a value");
    }
    if (!t->tok[j].sep) {
        if (ac_check_scalar(key, k, &t->tok[j], err) < 0) {
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
    if (!ac_rule_takes_list(k)) {
        return ac_fail(err, key, t->tok[j].offset, "[", 1,
                       "takes a single value, not a list");
    }
    if (sbuf_add(&b, "[", 1) < 0) {
        goto nomem;
    }
    j++;
    while (j < t->n && t->tok[j].sep != ']') {
        const ac_token *a = &t->tok[j], *v = NULL;
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
        if (ac_rule_is_roundup(k) &&
            ac_check_roundup_item(key, a, v, err) < 0) {
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
        ac_fail(err, key, end, NULL, 0, "unclosed '[': expected ']'");
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

int
ac_conf_parse(const char *s, size_t n, ac_conf *out, ac_error *err)
{
    tokens t = {NULL, 0, NULL};
    size_t i = 0;

    if (tokenise(s, n, &t, err) < 0) {
        return -1;
    }
    while (i < t.n) {
        const ac_token *k = &t.tok[i];
        char *key = NULL, *value = NULL;
        size_t value_offset;

        if (k->sep) {
            fail_expected(err, NULL, &t, i, n, "a key");
            goto error;
        }
        if (!ac_is_key_name(k->text)) {
            ac_fail(err, k->text, k->offset, k->text, k->len,
                    "'%s' is not a key name (letters, digits and '_')",
                    k->text);
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
    if (ac_check_relations(out, err) < 0) {
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
    if (!ac_is_key_name(key)) {
        return ac_fail(err, key, 0, key, strlen(key),
                       "'%s' is not a key name (letters, digits and '_')",
                       key);
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

/* An index of keys for ac_conf_update: open addressing over the patch's
 * entries, each slot the index of that key's last entry plus one. */
typedef struct {
    size_t *slot;
    unsigned char *placed;
    size_t mask;
} key_index;

static size_t
key_hash(const char *s)
{
    size_t h = 1469598103934665603u;
    for (; *s; s++) {
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    }
    return h;
}

/* The slot for `key` in ix: where it is, or the empty one it would take. */
static size_t
key_find(const key_index *ix, const ac_conf *patch, const char *key)
{
    size_t h = key_hash(key) & ix->mask;
    while (ix->slot[h] != 0 &&
           strcmp(patch->items[ix->slot[h] - 1].key, key) != 0) {
        h = (h + 1) & ix->mask;
    }
    return h;
}

int
ac_conf_update(ac_conf *c, const ac_conf *patch)
{
    key_index ix = {NULL, NULL, 0};
    ac_conf out = {NULL, 0, 0};
    size_t i, n = 16;

    while (n < 2 * patch->len) {
        n *= 2;
    }
    ix.slot = calloc(n, sizeof(size_t));
    ix.placed = calloc(n, 1);
    ix.mask = n - 1;
    if (ix.slot == NULL || ix.placed == NULL) {
        goto nomem;
    }
    for (i = 0; i < patch->len; i++) { /* the last entry of a key wins */
        ix.slot[key_find(&ix, patch, patch->items[i].key)] = i + 1;
    }
    /* Keys already there keep their first place; later duplicates go. */
    for (i = 0; i < c->len; i++) {
        const ac_entry *e = &c->items[i];
        size_t h = key_find(&ix, patch, e->key);
        const char *v = e->value;
        char *k2, *v2;
        if (ix.slot[h] != 0) {
            v = ix.placed[h] ? NULL : patch->items[ix.slot[h] - 1].value;
            ix.placed[h] = 1;
            if (v == NULL) {
                continue;
            }
        }
        k2 = dup_n(e->key, strlen(e->key));
        v2 = dup_n(v, strlen(v));
        if (k2 == NULL || v2 == NULL ||
            conf_append(&out, k2, v2, e->key_offset, e->value_offset) < 0) {
            free(k2);
            free(v2);
            goto nomem;
        }
    }
    /* New keys go last, in the order the patch first names them. */
    for (i = 0; i < patch->len; i++) {
        size_t h = key_find(&ix, patch, patch->items[i].key);
        const ac_entry *last = &patch->items[ix.slot[h] - 1];
        char *k2, *v2;
        if (ix.placed[h] || last->value == NULL) {
            ix.placed[h] = 1;
            continue;
        }
        ix.placed[h] = 1;
        k2 = dup_n(last->key, strlen(last->key));
        v2 = dup_n(last->value, strlen(last->value));
        if (k2 == NULL || v2 == NULL || conf_append(&out, k2, v2, 0, 0) < 0) {
            free(k2);
            free(v2);
            goto nomem;
        }
    }
    free(ix.slot);
    free(ix.placed);
    ac_conf_clear(c);
    *c = out;
    return 0;

nomem:
    free(ix.slot);
    free(ix.placed);
    ac_conf_clear(&out);
    return -1;
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
