/*
 * fuzz_conf.c -- libFuzzer harness for the configuration grammar
 * (csrc/grammar/conf.c), checking properties, not just the absence of crashes:
 *
 *   - a string that parses survives a round trip:
 *     parse(serialise(parse(s))) == parse(s), and serialise is a fixpoint;
 *   - a rejected string leaves the output empty, with an offset inside it
 *     and a message;
 *   - setting one key (as merge() does) changes only that key: every
 *     other entry keeps its place and value.
 *
 * The first input byte picks the key to set; the rest is the string.
 * Build: see fuzz/run.sh.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/conf.h"

static const char *const KEYS[] = {
    "expandable_segments",
    "max_split_size_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "backend",
    "large_segment_size_mb",
    "pinned_num_register_threads",
    "future_key",
};
static const char *const VALUES[] = {
    "True", "False", "64", "0.5", "[256:1,>:8]", "4", "native", "x",
};

#define CHECK(cond)                                                           \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "property failed: %s (line %d)\n", #cond,         \
                    __LINE__);                                                \
            abort();                                                          \
        }                                                                     \
    } while (0)

static int
same_entries(const ac_conf *a, const ac_conf *b)
{
    size_t i;
    if (a->len != b->len) {
        return 0;
    }
    for (i = 0; i < a->len; i++) {
        if (strcmp(a->items[i].key, b->items[i].key) != 0 ||
            strcmp(a->items[i].value, b->items[i].value) != 0) {
            return 0;
        }
    }
    return 1;
}

static void
check_set(const ac_conf *conf, const char *key, const char *value)
{
    ac_conf edited = {NULL, 0, 0};
    ac_error err;
    char *norm = NULL;
    size_t i, j = 0;
    int seen = 0;

    if (ac_value_parse(key, value, &norm, &err) != 0) {
        return;
    }
    CHECK(ac_conf_copy(&edited, conf) == 0);
    CHECK(ac_conf_set(&edited, key, norm) == 0);
    CHECK(strcmp(ac_conf_get(&edited, key), norm) == 0);
    /* Every other entry is where it was, with its value; `key` appears
     * once, at its first place (or last, when it was new). */
    for (i = 0; i < conf->len; i++) {
        const ac_entry *e = &conf->items[i];
        if (strcmp(e->key, key) == 0) {
            if (!seen) {
                CHECK(strcmp(edited.items[j].key, key) == 0);
                j++;
                seen = 1;
            }
            continue;
        }
        CHECK(j < edited.len);
        CHECK(strcmp(edited.items[j].key, e->key) == 0);
        CHECK(strcmp(edited.items[j].value, e->value) == 0);
        j++;
    }
    if (!seen) {
        CHECK(j + 1 == edited.len);
    }
    else {
        CHECK(j == edited.len);
    }
    CHECK(ac_conf_set(&edited, key, NULL) == 0);
    CHECK(ac_conf_get(&edited, key) == NULL);
    ac_conf_clear(&edited);
    free(norm);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ac_conf conf = {NULL, 0, 0}, again = {NULL, 0, 0};
    ac_error err;
    const char *s;
    size_t n, pick;
    char *out, *out2;

    if (size == 0) {
        return 0;
    }
    pick = data[0];
    s = (const char *)data + 1;
    n = size - 1;

    if (ac_conf_parse(s, n, &conf, &err) != 0) {
        CHECK(conf.len == 0 && conf.items == NULL);
        CHECK(err.nomem || err.offset <= n);
        CHECK(err.message[0] != '\0');
        return 0;
    }
    out = ac_conf_serialise(&conf, NULL);
    CHECK(out != NULL);
    CHECK(ac_conf_parse(out, strlen(out), &again, &err) == 0);
    CHECK(same_entries(&conf, &again));
    out2 = ac_conf_serialise(&again, NULL);
    CHECK(out2 != NULL && strcmp(out, out2) == 0);
    check_set(&conf, KEYS[pick % 8], VALUES[(pick / 8) % 8]);
    ac_conf_clear(&again);
    ac_conf_clear(&conf);
    free(out);
    free(out2);
    return 0;
}
