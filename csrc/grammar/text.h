/*
 * text.h -- the grammar's building blocks (text.c): error filling,
 * growable strings, entries.  Internal to the grammar; no Python.
 */
#ifndef ALLOCCONF_TEXT_H
#define ALLOCCONF_TEXT_H

#include "grammar/conf.h"

/* Fill *err; always returns -1 so callers can `return ac_fail(...)`. */
int ac_fail(ac_error *err, const char *key, size_t offset, const char *text,
            size_t text_len, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

/* Fill *err for "out of memory"; returns -1. */
int ac_fail_nomem(ac_error *err);

/* Copy at most AC_ERR_TEXT-1 bytes of src[0:n] into dst (an ac_error
 * field), marking a cut with "...". */
void ac_clip_text(char *dst, const char *src, size_t n);

/* A growable string for building canonical values. */
typedef struct {
    char *s;
    size_t len;
    size_t cap;
} sbuf;

/* Append s[0:n] to b, keeping it NUL-terminated.  0, or -1 when out of
 * memory. */
int ac_sbuf_add(sbuf *b, const char *s, size_t n);

/* Append an entry owning `key` and `value` to c.  0, or -1 when out of
 * memory (nothing taken). */
int ac_conf_append(ac_conf *c, char *key, char *value, size_t value_offset);

/* A malloc'd copy of s[0:n], NUL-terminated, or NULL. */
char *ac_dup_n(const char *s, size_t n);

#endif /* ALLOCCONF_TEXT_H */
