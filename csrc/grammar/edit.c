/*
 * edit.c -- changing and writing out parsed configurations (see conf.h):
 * set one key, apply a patch in one pass, look a key up, serialise, copy,
 * clear.  Plain C, like the rest of the grammar.
 */
#include "grammar/text.h"

#include <stdlib.h>
#include <string.h>

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
                char *v = ac_dup_n(value, strlen(value));
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
        char *k = ac_dup_n(key, strlen(key));
        char *v = ac_dup_n(value, strlen(value));
        if (k == NULL || v == NULL || ac_conf_append(c, k, v, 0) < 0) {
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
        k2 = ac_dup_n(e->key, strlen(e->key));
        v2 = ac_dup_n(v, strlen(v));
        if (k2 == NULL || v2 == NULL ||
            ac_conf_append(&out, k2, v2, e->value_offset) < 0) {
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
        k2 = ac_dup_n(last->key, strlen(last->key));
        v2 = ac_dup_n(last->value, strlen(last->value));
        if (k2 == NULL || v2 == NULL || ac_conf_append(&out, k2, v2, 0) < 0) {
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

int
ac_conf_drop(ac_conf *c, const ac_conf *names)
{
    ac_conf patch = {NULL, 0, 0};
    size_t i;
    int rc;

    if (names->len == 0) {
        return 0;
    }
    patch.items = calloc(names->len, sizeof(ac_entry));
    if (patch.items == NULL) {
        return -1;
    }
    /* A patch of the same keys with no values: "remove" each.  It only
     * borrows the keys, so it is freed by hand below. */
    for (i = 0; i < names->len; i++) {
        patch.items[i].key = names->items[i].key;
    }
    patch.len = patch.cap = names->len;
    rc = ac_conf_update(c, &patch);
    free(patch.items);
    return rc;
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

    if (ac_sbuf_add(&b, "", 0) < 0) {
        return NULL;
    }
    for (i = 0; i < c->len; i++) {
        const ac_entry *e = &c->items[i];
        if (skip_key != NULL && strcmp(e->key, skip_key) == 0) {
            continue;
        }
        if ((b.len > 0 && ac_sbuf_add(&b, ",", 1) < 0) ||
            ac_sbuf_add(&b, e->key, strlen(e->key)) < 0 ||
            ac_sbuf_add(&b, ":", 1) < 0 ||
            ac_sbuf_add(&b, e->value, strlen(e->value)) < 0) {
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
        char *k = ac_dup_n(e->key, strlen(e->key));
        char *v = ac_dup_n(e->value, strlen(e->value));
        if (k == NULL || v == NULL ||
            ac_conf_append(dst, k, v, e->value_offset) < 0) {
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
