/*
 * conf.h -- the allocator configuration grammar, in plain C.
 *
 * Tokenises a configuration string exactly as PyTorch's ConfigTokenizer
 * does (separators ',' ':' '[' ']', the C locale's whitespace dropped,
 * every other byte part of a word), validates the keys PyTorch knows,
 * keeps unknown keys verbatim, and serialises the result canonically
 * ("key:value,key:[a:b,c:d]").  conf.c holds the grammar, keys.c the
 * rules for known keys and the sticky keys, edit.c the changes and the
 * output.  The lowest layer of csrc/ (docs/design.md, "Layers"): plain
 * C, no Python, so the fuzzer in fuzz/ links these alone.
 */
#ifndef ALLOCCONF_CONF_H
#define ALLOCCONF_CONF_H

#include <stddef.h>

/* One "key:value" entry; a list value is stored as "[a:b,c:d]".
 * value_offset is where the value started in the string parsed (0 for
 * an entry made by an edit), for the errors of the rules between keys. */
typedef struct {
    char *key;
    char *value;
    size_t value_offset;
} ac_entry;

/* A parsed configuration: entries in the order written, duplicates kept
 * (PyTorch applies them in order, so the later one wins).  Used as a
 * patch (ac_conf_update), an entry's value may be NULL: "remove". */
typedef struct {
    ac_entry *items;
    size_t len;
    size_t cap;
} ac_conf;

enum { AC_ERR_TEXT = 64, AC_ERR_MESSAGE = 160 };

/* Where and why a string was rejected.  `key` is empty when the fault is
 * not inside an entry (a stray separator, say). */
typedef struct {
    size_t offset;
    int nomem;
    char key[AC_ERR_TEXT];
    char text[AC_ERR_TEXT];
    char message[AC_ERR_MESSAGE];
} ac_error;

/* Parse s[0:n] into *out (which must be empty), checking each known
 * key's value and the rules between keys.  Returns 0, or -1 with *err
 * filled and *out left empty. */
int ac_conf_parse(const char *s, size_t n, ac_conf *out, ac_error *err);

/* Parse the single value `value` for `key`, as if written "key:value".
 * On success *norm is a malloc'd canonical value (the caller frees it).
 * Returns 0, or -1 with *err filled (offsets relative to the value). */
int ac_value_parse(const char *key, const char *value, char **norm,
                   ac_error *err);

/* Set `key` to `value` (already canonical): the first occurrence keeps its
 * place, later duplicates go; a new key is appended; value NULL removes
 * every occurrence.  Returns 0, or -1 when out of memory. */
int ac_conf_set(ac_conf *c, const char *key, const char *value);

/* Apply `patch` to c in one pass, as ac_conf_set would key by key: an
 * entry of the patch whose value is NULL removes that key; for a key the
 * patch names twice its last entry wins.  Linear in the sizes of both.
 * Returns 0, or -1 when out of memory (c unchanged). */
int ac_conf_update(ac_conf *c, const ac_conf *patch);

/* The value in force for `key` (its last occurrence), or NULL. */
const char *ac_conf_get(const ac_conf *c, const char *key);

/* Canonical string of c, leaving out entries named `skip_key` (may be
 * NULL).  Returns a malloc'd string, or NULL when out of memory. */
char *ac_conf_serialise(const ac_conf *c, const char *skip_key);

/* Deep copy src into dst (which must be empty).  0, or -1 on no memory. */
int ac_conf_copy(ac_conf *dst, const ac_conf *src);

/* Free every entry and leave c empty and reusable. */
void ac_conf_clear(ac_conf *c);

/* 1 when s is one word of the grammar (so it can be a key): at least one
 * byte, none of them a separator, whitespace or NUL. */
int ac_is_word(const char *s);

/* Drop from c every key that `names` names.  0, or -1 when out of memory
 * (c unchanged). */
int ac_conf_drop(ac_conf *c, const ac_conf *names);

/* The keys torch keeps when a write leaves them out (docs/design.md,
 * "What torch does with a write"): expandable_segments,
 * large_segment_size_mb, expandable_segments_reserve and
 * expandable_segments_reserve_by_class, numbered 0..AC_NSTICKY-1. */
enum { AC_NSTICKY = 4 };

/* The sticky keys of c: bit i set when c names key i, bit i + AC_NSTICKY
 * when the value it gives is not torch's default; AC_STICKY_NAMED and
 * AC_STICKY_OFF take the two halves apart. */
unsigned ac_sticky_mask(const ac_conf *c);
#define AC_STICKY_NAMED(m) ((m) & ((1u << AC_NSTICKY) - 1))
#define AC_STICKY_OFF(m) ((m) >> AC_NSTICKY)

/* Sticky key i's name, and the value that restores torch's default (NULL
 * where torch has none it can be given back). */
const char *ac_sticky_key(int i);
const char *ac_sticky_default(int i);

/* The bits of the sticky keys a torch knows: all of them with the 2.10
 * configuration (`generic`), else only expandable_segments. */
unsigned ac_sticky_known(int generic);

/* Give dst each sticky key that `from` names and dst does not, with
 * from's value: what torch still holds after a write of dst.  0, or -1
 * when out of memory. */
int ac_sticky_carry(ac_conf *dst, const ac_conf *from);

#endif /* ALLOCCONF_CONF_H */
