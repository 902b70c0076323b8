/*
 * text.c -- the grammar's building blocks, used by its other rooms
 * (conf.c, edit.c, keys.c): error filling, growable strings, entries.
 */
#include "grammar/text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void
ac_clip_text(char *dst, const char *src, size_t n)
{
    if (n < AC_ERR_TEXT) {
        memcpy(dst, src, n);
        dst[n] = '\0';
        return;
    }
    memcpy(dst, src, AC_ERR_TEXT - 4);
    memcpy(dst + AC_ERR_TEXT - 4, "...", 4);
}

int
ac_fail(ac_error *err, const char *key, size_t offset, const char *text,
        size_t text_len, const char *fmt, ...)
{
    va_list ap;

    memset(err, 0, sizeof(*err));
    err->offset = offset;
    if (key != NULL) {
        ac_clip_text(err->key, key, strlen(key));
    }
    if (text != NULL) {
        ac_clip_text(err->text, text, text_len);
    }
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return -1;
}

int
ac_fail_nomem(ac_error *err)
{
    memset(err, 0, sizeof(*err));
    err->nomem = 1;
    snprintf(err->message, sizeof(err->message), "out of memory");
    return -1;
}

int
ac_sbuf_add(sbuf *b, const char *s, size_t n)
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

int
ac_conf_append(ac_conf *c, char *key, char *value, size_t value_offset)
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
    c->items[c->len].value_offset = value_offset;
    c->len++;
    return 0;
}

char *
ac_dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p != NULL) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}
