/* The tokens file: its line format, its errors (with line numbers and no
 * token bytes), the constant-time lookup, salt quotas and reach. */
#include <criterion/criterion.h>

#include "kvidx/alloc.h"
#include "kvidx/err.h"
#include "kvidx/tokens.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvidx_tokens_t *parse_ok(const char *text)
{
    kvidx_tokens_t *t = NULL;
    unsigned line = 0;
    const char *why = NULL;
    int rc = kvidx_tokens_parse(text, strlen(text), &t, &line, &why);
    cr_assert_eq(rc, 0, "line %u: %s", line, why ? why : "?");
    return t;
}

static unsigned parse_err(const char *text, const char **why)
{
    kvidx_tokens_t *t = NULL;
    unsigned line = 0;
    int rc = kvidx_tokens_parse(text, strlen(text), &t, &line, why);
    cr_assert_eq(rc, KVIDX_EINVAL, "accepted: %s", text);
    cr_assert_null(t);
    cr_assert_not_null(*why);
    return line;
}

static kvidx_principal_t find(const kvidx_tokens_t *t, const char *token)
{
    kvidx_principal_t p;
    cr_assert_eq(kvidx_tokens_find(t, token, strlen(token), &p), 0, "%s", token);
    return p;
}

Test(tokens, line_format)
{
    kvidx_tokens_t *t = parse_ok("# a comment\n"
                                 "\n"
                                 "   # an indented comment\n"
                                 "rd0 read\n"
                                 "wr1 write salt=alice quota_bytes=64MiB\n"
                                 "ad2 admin\n"
                                 "em3\twrite   salt=\n"
                                 "cr4 read salt=bob\r\n"
                                 "last5 write quota_bytes=1 salt=carol");
    cr_assert_eq(kvidx_tokens_count(t), 6);
    kvidx_principal_t p = find(t, "rd0");
    cr_assert_eq(p.role, KVIDX_ROLE_READ);
    cr_assert_eq(p.salt_bound, 0);
    cr_assert_eq(p.id, 4);
    p = find(t, "wr1");
    cr_assert_eq(p.role, KVIDX_ROLE_WRITE);
    cr_assert_eq(p.salt_bound, 1);
    cr_assert_str_eq(p.salt, "alice");
    cr_assert_eq(p.quota_bytes, 64ull << 20);
    cr_assert_eq(find(t, "ad2").role, KVIDX_ROLE_ADMIN);
    p = find(t, "em3");
    cr_assert_eq(p.salt_bound, 1, "salt= with nothing binds the empty salt");
    cr_assert_eq(p.salt_len, 0);
    cr_assert_str_eq(find(t, "cr4").salt, "bob", "a CR before the newline is not part of it");
    cr_assert_eq(find(t, "last5").quota_bytes, 1);
    kvidx_principal_t q;
    cr_assert_eq(kvidx_tokens_find(t, "rd", 2, &q), KVIDX_EUNAUTHORIZED, "a prefix is no token");
    cr_assert_eq(kvidx_tokens_find(t, "rd0x", 4, &q), KVIDX_EUNAUTHORIZED);
    cr_assert_eq(kvidx_tokens_find(t, "", 0, &q), KVIDX_EUNAUTHORIZED);
    cr_assert_eq(kvidx_tokens_find(t, "RD0", 3, &q), KVIDX_EUNAUTHORIZED, "tokens are exact");
    cr_assert_eq(kvidx_tokens_at(t, 0, &q), 0);
    cr_assert_eq(q.id, 4);
    cr_assert_eq(kvidx_tokens_at(t, 6, &q), KVIDX_ENOTFOUND);
    kvidx_tokens_free(t);
}

Test(tokens, a_hash_later_in_a_line_is_part_of_it)
{
    kvidx_tokens_t *t = parse_ok("ab#cd read\n");
    find(t, "ab#cd");
    kvidx_tokens_free(t);
    const char *why;
    cr_assert_eq(parse_err("tok read # not a comment\n", &why), 1);
}

Test(tokens, errors_name_the_line_never_the_token)
{
    static const struct {
        const char *text;
        unsigned line;
    } bad[] = {
        {"ok read\nsecret-token-123 superuser\n", 2},
        {"secret-token-123\n", 1},
        {"secret-token-123 read salt=a/b\n", 1},
        {"secret-token-123 read salt=a@b\n", 1},
        {"secret-token-123 read quota_bytes=10MiB\n", 1},
        {"secret-token-123 write salt=a quota_bytes=ten\n", 1},
        {"secret-token-123 write salt=a quota_bytes=0\n", 1},
        {"secret-token-123 write salt=a quota_bytes=1 quota_bytes=2\n", 1},
        {"secret-token-123 write salt=a salt=b\n", 1},
        {"secret-token-123 write color=blue\n", 1},
        {"secret-token-123 admin salt=a\n", 1},
        {"\n\nsecret-token-123 read\nsecret-token-123 write\n", 4},
        {"secret\x01token read\n", 1},
        {"secret\xc3\xa9token read\n", 1},
        {"ok read\nsecret,token-123 read\n", 2},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *why;
        cr_assert_eq(parse_err(bad[i].text, &why), bad[i].line, "case %zu", i);
        cr_assert_null(strstr(why, "secret"), "case %zu: the reason quotes the token: %s", i, why);
        cr_assert_null(strstr(why, "token-123"), "case %zu", i);
    }
    char big[600];
    memset(big, 'x', 257);
    strcpy(big + 257, " read\n");
    const char *why;
    cr_assert_eq(parse_err(big, &why), 1, "a token of 257 bytes");
    memset(big, 'x', 256);
    strcpy(big + 256, " read\n");
    kvidx_tokens_t *t = parse_ok(big);
    kvidx_tokens_free(t);
    static const char nul[] = "tok read\nto\0k read\n";
    kvidx_tokens_t *t2 = NULL;
    unsigned line = 0;
    cr_assert_eq(kvidx_tokens_parse(nul, sizeof(nul) - 1, &t2, &line, &why), KVIDX_EINVAL);
    cr_assert_eq(line, 2);
}

Test(tokens, salt_quota_smallest_wins_and_reach)
{
    kvidx_tokens_t *t = parse_ok("a write salt=alice quota_bytes=2GiB\n"
                                 "b read salt=alice quota_bytes=1GiB\n"
                                 "c write salt=alice\n"
                                 "d write salt=bob\n"
                                 "e write salt= quota_bytes=5\n"
                                 "f write\n");
    cr_assert_eq(kvidx_tokens_salt_quota(t, "alice", 5), 1ull << 30);
    cr_assert_eq(kvidx_tokens_salt_quota(t, "bob", 3), 0);
    cr_assert_eq(kvidx_tokens_salt_quota(t, "", 0), 5);
    cr_assert_eq(kvidx_tokens_salt_quota(t, "alic", 4), 0);
    kvidx_principal_t a = find(t, "a"), e = find(t, "e"), f = find(t, "f");
    cr_assert(kvidx_principal_sees_salt(&a, "alice", 5));
    cr_assert_not(kvidx_principal_sees_salt(&a, "bob", 3));
    cr_assert_not(kvidx_principal_sees_salt(&a, "", 0));
    cr_assert_not(kvidx_principal_sees_salt(&a, "alicex", 6));
    cr_assert(kvidx_principal_sees_salt(&e, "", 0));
    cr_assert_not(kvidx_principal_sees_salt(&e, "alice", 5));
    cr_assert(kvidx_principal_sees_salt(&f, "alice", 5));
    cr_assert(kvidx_principal_sees_salt(&f, "", 0));
    /* A key without a salt may carry a NULL salt pointer. */
    cr_assert(kvidx_principal_sees_salt(&e, NULL, 0));
    cr_assert_not(kvidx_principal_sees_salt(&a, NULL, 0));
    cr_assert_eq(kvidx_tokens_salt_quota(t, NULL, 0), 5);
    kvidx_tokens_free(t);
}

Test(tokens, sizes)
{
    static const struct {
        const char *s;
        uint64_t v;
    } ok[] = {{"1", 1},
              {"64KiB", 64 << 10},
              {"64 kib", 64 << 10},
              {"3MiB", 3 << 20},
              {"2GiB", 2ull << 30},
              {"1TiB", 1ull << 40},
              {"18446744073709551615", UINT64_MAX}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        uint64_t v = 0;
        cr_assert_eq(kvidx_parse_size(ok[i].s, strlen(ok[i].s), &v), 0, "%s", ok[i].s);
        cr_assert_eq(v, ok[i].v, "%s", ok[i].s);
    }
    static const char *bad[] = {
        "",       "KiB", "1 ", "1KB", "-1", "1.5GiB", "18446744073709551616", "16777216TiB",
        "1  KiB", "0x10"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 0;
        cr_assert_eq(kvidx_parse_size(bad[i], strlen(bad[i]), &v), KVIDX_EINVAL, "'%s'", bad[i]);
    }
}

static long budget;
static void *fail_malloc(void *ctx, size_t n)
{
    (void)ctx;
    return budget-- > 0 ? malloc(n) : NULL;
}
static void *fail_realloc(void *ctx, void *p, size_t n)
{
    (void)ctx;
    return budget-- > 0 ? realloc(p, n) : NULL;
}
static void plain_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

Test(tokens, out_of_memory_at_every_allocation)
{
    const kvidx_allocator_t a = {fail_malloc, fail_realloc, plain_free, NULL};
    char text[4096] = "";
    for (int i = 0; i < 40; i++) {
        char line[64];
        snprintf(line, sizeof(line), "token-%d write salt=s%d\n", i, i % 3);
        strcat(text, line);
    }
    int done = 0;
    for (long n = 0; n < 50 && !done; n++) {
        kvidx_set_allocator(&a);
        budget = n;
        kvidx_tokens_t *t = NULL;
        unsigned line;
        const char *why;
        int rc = kvidx_tokens_parse(text, strlen(text), &t, &line, &why);
        kvidx_set_allocator(NULL);
        if (rc == 0) {
            cr_assert_eq(kvidx_tokens_count(t), 40);
            kvidx_tokens_free(t);
            done = 1;
        } else {
            cr_assert_eq(rc, KVIDX_ENOMEM);
            cr_assert_null(t);
        }
    }
    cr_assert(done);
}

/* Many tokens: every one is found with its own principal, none that is not
 * in the file, and a repeat among thousands is found with its line. */
Test(tokens, many_tokens_in_the_table)
{
    enum { N = 5000 };
    size_t cap = (size_t)N * 48 + 64;
    char *text = malloc(cap);
    size_t n = 0;
    for (int i = 0; i < N; i++)
        n += (size_t)snprintf(text + n, cap - n, "tok-%d-x %s salt=s%d\n", i,
                              i % 2 ? "read" : "write", i);
    kvidx_tokens_t *t = parse_ok(text);
    cr_assert_eq(kvidx_tokens_count(t), N);
    for (int i = 0; i < N; i++) {
        char tok[32], salt[16];
        snprintf(tok, sizeof(tok), "tok-%d-x", i);
        snprintf(salt, sizeof(salt), "s%d", i);
        kvidx_principal_t p = find(t, tok);
        cr_assert_str_eq(p.salt, salt);
        cr_assert_eq(p.id, (uint32_t)i + 1);
        snprintf(tok, sizeof(tok), "tok-%d-y", i);
        cr_assert_eq(kvidx_tokens_find(t, tok, strlen(tok), &p), KVIDX_EUNAUTHORIZED);
    }
    kvidx_tokens_free(t);
    n += (size_t)snprintf(text + n, cap - n, "tok-4321-x admin\n");
    const char *why;
    cr_assert_eq(parse_err(text, &why), N + 1);
    cr_assert(strstr(why, "twice"), "%s", why);
    free(text);
    kvidx_tokens_t *none = parse_ok("# nothing\n");
    kvidx_principal_t p;
    cr_assert_eq(kvidx_tokens_find(none, "x", 1, &p), KVIDX_EUNAUTHORIZED);
    kvidx_tokens_free(none);
}
