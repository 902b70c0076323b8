/*
 * conf_impl.h -- what the two halves of the grammar share: tokens and
 * error filling (conf.c), the rules for known keys (keys.c).  Internal to
 * the grammar; no Python here either.
 */
#ifndef ALLOCCONF_CONF_IMPL_H
#define ALLOCCONF_CONF_IMPL_H

#include "conf.h"

/* A token: a separator (sep != 0) or a word, whose text (whitespace
 * removed) starts at text within the tokeniser's buffer. */
typedef struct {
    char sep;
    size_t offset;
    char *text;
    size_t len;
} ac_token;

/* Fill *err; always returns -1 so callers can `return ac_fail(...)`. */
int ac_fail(ac_error *err, const char *key, size_t offset, const char *text,
            size_t text_len, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

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
int ac_conf_append(ac_conf *c, char *key, char *value, size_t key_offset,
                   size_t value_offset);

/* A malloc'd copy of s[0:n], NUL-terminated, or NULL. */
char *ac_dup_n(const char *s, size_t n);

/* The rule for a key PyTorch knows (keys.c); NULL for an unknown key. */
typedef struct ac_key_rule ac_key_rule;
const ac_key_rule *ac_rule(const char *key);

/* 1 when the key's value may be a list: roundup_power2_divisions and
 * unknown keys (rule NULL). */
int ac_rule_takes_list(const ac_key_rule *k);

/* 1 for roundup_power2_divisions, whose list items are checked. */
int ac_rule_is_roundup(const ac_key_rule *k);

/* Check one scalar word against its key's rule, as torch reads it.
 * Returns 0, or -1 with *err filled. */
int ac_check_scalar(const char *key, const ac_key_rule *k, const ac_token *w,
                    ac_error *err);

/* Check one roundup_power2_divisions list item "interval:divisions" (b is
 * NULL when the item has no ':').  0, or -1 with *err filled. */
int ac_check_roundup_item(const char *key, const ac_token *a,
                          const ac_token *b, ac_error *err);

/* The rules between keys of a whole configuration.  0, or -1 with *err
 * filled. */
int ac_check_relations(const ac_conf *c, ac_error *err);

#endif /* ALLOCCONF_CONF_IMPL_H */
