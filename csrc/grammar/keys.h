/*
 * keys.h -- the keys torch knows and the rules for their values
 * (keys.c), for the parser (conf.c).  Internal to the grammar; no Python.
 */
#ifndef ALLOCCONF_KEYS_H
#define ALLOCCONF_KEYS_H

#include "grammar/conf.h"

/* A token: a separator (sep != 0) or a word, whose text (whitespace
 * removed) starts at text within the tokeniser's buffer. */
typedef struct {
    char sep;
    size_t offset;
    char *text;
    size_t len;
} ac_token;
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

#endif /* ALLOCCONF_KEYS_H */
