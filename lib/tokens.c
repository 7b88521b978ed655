/*
 * The tokens table: parsing the tokens file and finding a presented token.
 *
 * Invariants: every entry's digest is the keyed BLAKE2b-256 of its token
 * under the table's key; no two entries have the same digest (a token given
 * twice is a file error); the open-addressing table `slots` (a power of two
 * of at least twice the entries) holds 1 + the index of every entry exactly
 * once, placed by the first 8 bytes of its digest; no token is kept in the
 * clear, and no error message quotes a line's bytes. A failed parse frees
 * everything it built.
 *
 * A lookup digests the presented token and probes the table by that
 * digest, comparing whole digests with sodium_memcmp: its time depends on
 * where the digest of the presented token falls, which nobody can steer
 * without the table's random key, and never on how many bytes of it match
 * a stored token. It costs one digest and a probe or two, however many
 * tokens the file holds.
 */
#include "kvidx/tokens.h"

#include "kvidx/alloc.h"
#include "kvidx/err.h"

#include <sodium.h>
#include <string.h>

#define DIGEST_BYTES 32

struct entry {
    uint8_t digest[DIGEST_BYTES];
    kvidx_principal_t p;
};

struct kvidx_tokens {
    uint8_t key[crypto_generichash_KEYBYTES];
    struct entry *items;
    size_t n, cap;
    uint32_t *slots; /* 1 + entry index, 0 when empty */
    size_t nslots;   /* power of two, or 0 when there is no entry */
};

/* Where a digest starts its probe. */
static size_t slot_of(const kvidx_tokens_t *t, const uint8_t *d)
{
    uint64_t h = 0;
    for (int i = 0; i < 8; i++)
        h = h << 8 | d[i];
    return (size_t)h & (t->nslots - 1);
}

static void digest(const kvidx_tokens_t *t, const char *token, size_t n, uint8_t *out)
{
    crypto_generichash(out, DIGEST_BYTES, (const unsigned char *)token, n, t->key, sizeof(t->key));
}

int kvidx_parse_size(const char *s, size_t n, uint64_t *out)
{
    static const struct {
        const char *suffix;
        uint64_t mult;
    } units[] = {{"", 1},
                 {"kib", 1ull << 10},
                 {"mib", 1ull << 20},
                 {"gib", 1ull << 30},
                 {"tib", 1ull << 40}};
    size_t i = 0;
    uint64_t v = 0;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return KVIDX_EINVAL;
        v = v * 10 + d;
    }
    if (i == 0)
        return KVIDX_EINVAL;
    size_t u = i < n && s[i] == ' ' ? i + 1 : i;
    size_t ulen = n - u;
    for (size_t k = 0; k < sizeof(units) / sizeof(units[0]); k++) {
        if (strlen(units[k].suffix) != ulen)
            continue;
        int same = 1;
        for (size_t j = 0; j < ulen; j++) {
            char c = s[u + j];
            if (c >= 'A' && c <= 'Z')
                c = (char)(c - 'A' + 'a');
            same &= c == units[k].suffix[j];
        }
        if (!same || (u != i && ulen == 0))
            continue;
        if (v > UINT64_MAX / units[k].mult)
            return KVIDX_EINVAL;
        *out = v * units[k].mult;
        return 0;
    }
    return KVIDX_EINVAL;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

/* The next blank-separated word of [*p, end): its start and length. */
static size_t next_word(const char **p, const char *end, const char **word)
{
    const char *s = *p;
    while (s < end && is_space(*s))
        s++;
    *word = s;
    while (s < end && !is_space(*s))
        s++;
    *p = s;
    return (size_t)(s - *word);
}

static int parse_role(const char *w, size_t n, kvidx_role_t *role)
{
    static const struct {
        const char *name;
        kvidx_role_t role;
    } roles[] = {
        {"read", KVIDX_ROLE_READ}, {"write", KVIDX_ROLE_WRITE}, {"admin", KVIDX_ROLE_ADMIN}};
    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++) {
        if (strlen(roles[i].name) == n && memcmp(roles[i].name, w, n) == 0) {
            *role = roles[i].role;
            return 0;
        }
    }
    return KVIDX_EINVAL;
}

/* A token: printable ASCII without ',' (a ',' in an Authorization value
 * is where the daemon joins repeated header lines, so a token holding one
 * could be put together from two lines). */
static int valid_token(const char *w, size_t n)
{
    if (n < 1 || n > KVIDX_TOKEN_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)w[i] <= 0x20 || (unsigned char)w[i] >= 0x7f || w[i] == ',')
            return 0;
    return 1;
}

/* The options after the role: salt= and quota_bytes=, each at most once. */
static int parse_options(const char *s, const char *end, kvidx_principal_t *p, const char **why)
{
    int have_quota = 0;
    const char *w;
    size_t n;
    while ((n = next_word(&s, end, &w)) > 0) {
        if (n >= 5 && memcmp(w, "salt=", 5) == 0) {
            if (p->salt_bound) {
                *why = "salt= given twice";
                return KVIDX_EINVAL;
            }
            if (kvidx_key_check_salt(w + 5, n - 5, NULL) != 0) {
                *why = "salt= is not a valid cache_salt (at most 128 bytes, no @ / \\ or NUL)";
                return KVIDX_EINVAL;
            }
            p->salt_bound = 1;
            p->salt_len = (uint8_t)(n - 5);
            memcpy(p->salt, w + 5, n - 5);
            p->salt[n - 5] = '\0';
        } else if (n >= 12 && memcmp(w, "quota_bytes=", 12) == 0) {
            if (have_quota || kvidx_parse_size(w + 12, n - 12, &p->quota_bytes) != 0 ||
                p->quota_bytes == 0) {
                *why = have_quota ? "quota_bytes= given twice"
                                  : "quota_bytes= must be a size above 0 (e.g. 64GiB)";
                return KVIDX_EINVAL;
            }
            have_quota = 1;
        } else {
            *why = "unknown option (expected salt= or quota_bytes=)";
            return KVIDX_EINVAL;
        }
    }
    if (have_quota && !p->salt_bound) {
        *why = "quota_bytes= needs salt= on the same line";
        return KVIDX_EINVAL;
    }
    if (p->salt_bound && p->role == KVIDX_ROLE_ADMIN) {
        *why = "an admin token reaches every salt: salt= does not apply";
        return KVIDX_EINVAL;
    }
    return 0;
}

static int add_entry(kvidx_tokens_t *t, const struct entry *e)
{
    if (t->n >= UINT32_MAX / 4)
        return KVIDX_ENOMEM;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8;
        struct entry *items = kvidx_realloc(t->items, cap * sizeof(*items));
        if (!items)
            return KVIDX_ENOMEM;
        t->items = items;
        t->cap = cap;
    }
    t->items[t->n++] = *e;
    return 0;
}

/* One line that is not blank and not a comment. */
static int parse_line(kvidx_tokens_t *t, const char *s, const char *end, unsigned lineno,
                      const char **why)
{
    struct entry e;
    memset(&e, 0, sizeof(e));
    const char *w;
    size_t n = next_word(&s, end, &w);
    if (!valid_token(w, n)) {
        *why = "the token must be 1..256 printable ASCII bytes, without ','";
        return KVIDX_EINVAL;
    }
    digest(t, w, n, e.digest);
    const char *r;
    size_t rn = next_word(&s, end, &r);
    if (rn == 0 || parse_role(r, rn, &e.p.role) != 0) {
        *why = "the role must be read, write or admin";
        sodium_memzero(&e, sizeof(e));
        return KVIDX_EINVAL;
    }
    e.p.id = lineno;
    int rc = parse_options(s, end, &e.p, why);
    if (rc == 0)
        rc = add_entry(t, &e);
    sodium_memzero(&e, sizeof(e));
    return rc;
}

/* Places every entry in the table: 0, KVIDX_ENOMEM, or KVIDX_EINVAL with
 * *dup_line the line of a token given again. */
static int build_slots(kvidx_tokens_t *t, unsigned *dup_line)
{
    if (t->n == 0)
        return 0;
    size_t cap = 8;
    while (cap < 2 * t->n)
        cap *= 2;
    t->slots = kvidx_calloc(cap, sizeof(*t->slots));
    if (!t->slots)
        return KVIDX_ENOMEM;
    t->nslots = cap;
    for (size_t i = 0; i < t->n; i++) {
        size_t j = slot_of(t, t->items[i].digest);
        for (; t->slots[j]; j = (j + 1) & (cap - 1)) {
            if (sodium_memcmp(t->items[t->slots[j] - 1].digest, t->items[i].digest, DIGEST_BYTES) ==
                0) {
                *dup_line = t->items[i].p.id;
                return KVIDX_EINVAL;
            }
        }
        t->slots[j] = (uint32_t)(i + 1);
    }
    return 0;
}

int kvidx_tokens_parse(const char *text, size_t n, kvidx_tokens_t **out, unsigned *err_line,
                       const char **why)
{
    static const char *oom = "out of memory";
    *out = NULL;
    *err_line = 0;
    *why = NULL;
    if (sodium_init() < 0) {
        *why = "libsodium could not be initialized";
        return KVIDX_EINTERNAL;
    }
    kvidx_tokens_t *t = kvidx_calloc(1, sizeof(*t));
    if (!t) {
        *why = oom;
        return KVIDX_ENOMEM;
    }
    randombytes_buf(t->key, sizeof(t->key));
    const char *p = text, *end = text + n;
    unsigned lineno = 0;
    int rc = 0;
    while (p < end && rc == 0) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = eol ? eol : end;
        lineno++;
        const char *s = p;
        while (s < line_end && is_space(*s))
            s++;
        if (s < line_end && *s != '#') {
            if (memchr(s, '\0', (size_t)(line_end - s))) {
                *why = "the line holds a NUL byte";
                rc = KVIDX_EINVAL;
            } else {
                rc = parse_line(t, s, line_end, lineno, why);
            }
        }
        p = eol ? eol + 1 : end;
    }
    if (rc == 0) {
        unsigned dup = 0;
        rc = build_slots(t, &dup);
        if (rc == KVIDX_EINVAL) {
            lineno = dup;
            *why = "the same token is given twice";
        }
    }
    if (rc != 0) {
        *err_line = lineno;
        if (rc == KVIDX_ENOMEM)
            *why = oom;
        kvidx_tokens_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void kvidx_tokens_free(kvidx_tokens_t *t)
{
    if (!t)
        return;
    if (t->items)
        sodium_memzero(t->items, t->cap * sizeof(*t->items));
    kvidx_free(t->items);
    kvidx_free(t->slots);
    sodium_memzero(t, sizeof(*t));
    kvidx_free(t);
}

size_t kvidx_tokens_count(const kvidx_tokens_t *t)
{
    return t ? t->n : 0;
}

int kvidx_tokens_find(const kvidx_tokens_t *t, const char *token, size_t n, kvidx_principal_t *out)
{
    if (!t || n < 1 || n > KVIDX_TOKEN_MAX || !t->nslots)
        return KVIDX_EUNAUTHORIZED;
    uint8_t d[DIGEST_BYTES];
    digest(t, token, n, d);
    size_t found = t->n;
    for (size_t j = slot_of(t, d); t->slots[j]; j = (j + 1) & (t->nslots - 1)) {
        if (sodium_memcmp(t->items[t->slots[j] - 1].digest, d, DIGEST_BYTES) == 0) {
            found = t->slots[j] - 1;
            break;
        }
    }
    sodium_memzero(d, sizeof(d));
    if (found == t->n)
        return KVIDX_EUNAUTHORIZED;
    *out = t->items[found].p;
    return 0;
}

int kvidx_tokens_at(const kvidx_tokens_t *t, size_t i, kvidx_principal_t *out)
{
    if (!t || i >= t->n)
        return KVIDX_ENOTFOUND;
    *out = t->items[i].p;
    return 0;
}

uint64_t kvidx_tokens_salt_quota(const kvidx_tokens_t *t, const char *salt, size_t salt_len)
{
    uint64_t q = 0;
    for (size_t i = 0; t && i < t->n; i++) {
        const kvidx_principal_t *p = &t->items[i].p;
        if (!p->salt_bound || !p->quota_bytes || p->salt_len != salt_len ||
            (salt_len && memcmp(p->salt, salt, salt_len) != 0))
            continue;
        if (q == 0 || p->quota_bytes < q)
            q = p->quota_bytes;
    }
    return q;
}

int kvidx_principal_sees_salt(const kvidx_principal_t *p, const char *salt, size_t salt_len)
{
    if (!p->salt_bound)
        return 1;
    /* salt may be NULL when salt_len is 0 (a key without a salt). */
    return p->salt_len == salt_len && (salt_len == 0 || memcmp(p->salt, salt, salt_len) == 0);
}
