/*
 * conf.c -- tokenise, parse, validate, set and serialise allocator
 * configuration strings (see conf.h).
 *
 * The tokeniser mirrors PyTorch's ConfigTokenizer: ',' ':' '[' ']' are
 * tokens of their own, the C locale's whitespace is dropped, even inside
 * a word, and every other byte (control bytes and non-ASCII included)
 * belongs to a word.  The one byte allocconf refuses where torch does not
 * is NUL, which a C string cannot hold (docs/troubleshooting.md lists
 * every difference).  Values are checked by the rules in keys.c, which
 * read numbers as torch does; what torch refuses is refused here first,
 * with its offset, rather than half-applied by torch's setter.
 */
#include "grammar/keys.h"
#include "grammar/text.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        return ac_fail_nomem(err);
    }
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c == '\0') {
            tokens_free(t);
            return ac_fail(err, NULL, i, NULL, 0,
                           "NUL character: allocconf cannot hold it in a "
                           "configuration");
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
ac_is_word(const char *s)
{
    if (*s == '\0') {
        return 0;
    }
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (is_sep(c) || is_space(c)) {
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
            return ac_fail_nomem(err);
        }
        memcpy(*norm, t->tok[j].text, t->tok[j].len + 1);
        return 0;
    }
    /* A list: '[' (item (',' item)* ','?)? ']', item = word (':' word)? */
    if (!ac_rule_takes_list(k)) {
        return ac_fail(err, key, t->tok[j].offset, "[", 1,
                       "takes a single value, not a list");
    }
    if (ac_sbuf_add(&b, "[", 1) < 0) {
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
        if ((b.len > 1 && ac_sbuf_add(&b, ",", 1) < 0) ||
            ac_sbuf_add(&b, a->text, a->len) < 0 ||
            (v && (ac_sbuf_add(&b, ":", 1) < 0 ||
                   ac_sbuf_add(&b, v->text, v->len) < 0))) {
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
    if (ac_sbuf_add(&b, "]", 1) < 0) {
        goto nomem;
    }
    *i = j;
    *norm = b.s;
    return 0;

nomem:
    ac_fail_nomem(err);
error:
    free(b.s);
    return -1;
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

        /* Any word is a key, as in torch: one it does not know is kept
         * verbatim (a CUDA build's setter refuses it). */
        if (k->sep) {
            fail_expected(err, NULL, &t, i, n, "a key");
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
        key = ac_dup_n(k->text, k->len);
        if (key == NULL || ac_conf_append(out, key, value, value_offset) < 0) {
            free(key);
            free(value);
            ac_fail_nomem(err);
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
    if (!ac_is_word(key)) {
        return ac_fail(err, key, 0, key, strlen(key),
                       "'%s' is not a key (one word: no separator or space)",
                       key);
    }
    if (tokenise(value, n, &t, err) < 0) {
        ac_clip_text(err->key, key, strlen(key));
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
