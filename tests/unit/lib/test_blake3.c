/*
 * BLAKE3 (lib/blake3.c) against references that do not come from it: a few
 * published hashes written out here, and the `b3sum` tool run on the same
 * bytes at test time (the official test-vector lengths with input i % 251,
 * every length 0..2100, 200 seeded random lengths up to 20 KiB, a 4 MiB
 * input, and extendable output of many lengths). Incremental hashing with
 * updates cut at random points must equal the one-shot hash.
 */
#include "kvidx/blake3.h"
#include "b3sum_ref.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64: a seeded, reproducible source for lengths, bytes and cuts. */
static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

static void fill_random(uint64_t *s, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)next_rand(s);
}

/* The input of the official test vectors: byte i is i % 251. */
static uint8_t *pattern_input(size_t n)
{
    uint8_t *p = malloc(n + 1);
    cr_assert(p != NULL);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i % 251);
    return p;
}

static void hex(const uint8_t *p, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[p[i] >> 4];
        out[2 * i + 1] = d[p[i] & 15];
    }
    out[2 * n] = '\0';
}

/* Hash of data fed in pieces cut at `cuts` random points (some empty). */
static void hash_in_pieces(uint64_t *s, const uint8_t *data, size_t len, int cuts, uint8_t *out,
                           size_t out_len)
{
    kvidx_blake3_t h;
    kvidx_blake3_init(&h);
    size_t done = 0;
    for (int i = 0; i < cuts && done < len; i++) {
        size_t step = (size_t)(next_rand(s) % (len - done + 1));
        if (next_rand(s) % 4 == 0)
            step = 0;
        kvidx_blake3_update(&h, data + done, step);
        done += step;
    }
    kvidx_blake3_update(&h, data + done, len - done);
    kvidx_blake3_final(&h, out, out_len);
}

/* ---- published values, no b3sum needed ---- */

Test(blake3, published_hashes)
{
    static const struct {
        const char *what;
        size_t pattern_len; /* input i % 251 of this length, or */
        const char *text;   /* this text when not NULL */
        const char *hash;
    } cases[] = {
        {"empty input", 0, "", "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"},
        {"\"abc\"", 0, "abc", "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"},
        {"official vector, 1 byte", 1, NULL,
         "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213"},
        {"official vector, 1024 bytes", 1024, NULL,
         "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7"},
        {"official vector, 1025 bytes", 1025, NULL,
         "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint8_t *in = cases[i].text ? NULL : pattern_input(cases[i].pattern_len);
        const void *data = cases[i].text ? (const void *)cases[i].text : in;
        size_t len = cases[i].text ? strlen(cases[i].text) : cases[i].pattern_len;
        uint8_t out[KVIDX_BLAKE3_OUT_LEN];
        char got[2 * KVIDX_BLAKE3_OUT_LEN + 1];
        kvidx_blake3(data, len, out);
        hex(out, sizeof(out), got);
        cr_expect_str_eq(got, cases[i].hash, "%s", cases[i].what);
        free(in);
    }
}

Test(blake3, zero_length_update_and_null_data)
{
    uint8_t a[KVIDX_BLAKE3_OUT_LEN], b[KVIDX_BLAKE3_OUT_LEN];
    kvidx_blake3_t h;
    kvidx_blake3_init(&h);
    kvidx_blake3_update(&h, NULL, 0);
    kvidx_blake3_final(&h, a, sizeof(a));
    kvidx_blake3_final(&h, NULL, 0);
    kvidx_blake3("", 0, b);
    cr_assert(memcmp(a, b, sizeof(a)) == 0);
}

/* ---- against b3sum ---- */

Test(blake3, official_lengths_default_and_xof)
{
    static const size_t lens[] = {0,    1,    1023, 1024,  1025,  2048,  2049, 3072,
                                  3073, 4096, 4097, 5120,  5121,  6144,  6145, 7168,
                                  7169, 8192, 8193, 16384, 31744, 102400};
    enum { N = sizeof(lens) / sizeof(lens[0]), XOF = 131 };
    const uint8_t *in[N];
    for (size_t i = 0; i < N; i++)
        in[i] = pattern_input(lens[i]);
    uint8_t want32[N * KVIDX_BLAKE3_OUT_LEN], want131[N * XOF];
    b3sum_many(in, lens, N, KVIDX_BLAKE3_OUT_LEN, want32);
    b3sum_many(in, lens, N, XOF, want131);
    for (size_t i = 0; i < N; i++) {
        uint8_t got[XOF];
        kvidx_blake3(in[i], lens[i], got);
        cr_expect(memcmp(got, want32 + i * KVIDX_BLAKE3_OUT_LEN, KVIDX_BLAKE3_OUT_LEN) == 0,
                  "hash of %zu bytes differs from b3sum", lens[i]);
        kvidx_blake3_t h;
        kvidx_blake3_init(&h);
        kvidx_blake3_update(&h, in[i], lens[i]);
        kvidx_blake3_final(&h, got, XOF);
        cr_expect(memcmp(got, want131 + i * XOF, XOF) == 0,
                  "131-byte output of %zu bytes differs from b3sum", lens[i]);
        free((void *)in[i]);
    }
}

Test(blake3, every_length_up_to_2100)
{
    enum { MAXLEN = 2100, N = MAXLEN + 1 };
    uint64_t seed = 2100;
    uint8_t *buf = malloc((size_t)N * MAXLEN + 1);
    const uint8_t **in = malloc(N * sizeof(*in));
    size_t *lens = malloc(N * sizeof(*lens));
    uint8_t *want = malloc((size_t)N * KVIDX_BLAKE3_OUT_LEN);
    cr_assert(buf && in && lens && want);
    for (size_t n = 0; n < N; n++) {
        in[n] = buf + n * MAXLEN;
        lens[n] = n;
        fill_random(&seed, buf + n * MAXLEN, n);
    }
    b3sum_many(in, lens, N, KVIDX_BLAKE3_OUT_LEN, want);
    for (size_t n = 0; n < N; n++) {
        uint8_t got[KVIDX_BLAKE3_OUT_LEN];
        kvidx_blake3(in[n], n, got);
        cr_expect(memcmp(got, want + n * KVIDX_BLAKE3_OUT_LEN, sizeof(got)) == 0,
                  "hash of %zu random bytes differs from b3sum", n);
    }
    free(want);
    free(lens);
    free(in);
    free(buf);
}

Test(blake3, random_lengths_and_random_splits)
{
    enum { N = 200, MAXLEN = 20 * 1024 };
    uint64_t seed = 20240601;
    const uint8_t *in[N];
    size_t lens[N];
    for (size_t i = 0; i < N; i++) {
        lens[i] = (size_t)(next_rand(&seed) % (MAXLEN + 1));
        uint8_t *p = malloc(lens[i] + 1);
        cr_assert(p != NULL);
        fill_random(&seed, p, lens[i]);
        in[i] = p;
    }
    static uint8_t want[N * KVIDX_BLAKE3_OUT_LEN];
    b3sum_many(in, lens, N, KVIDX_BLAKE3_OUT_LEN, want);
    for (size_t i = 0; i < N; i++) {
        uint8_t one[KVIDX_BLAKE3_OUT_LEN], split[KVIDX_BLAKE3_OUT_LEN];
        kvidx_blake3(in[i], lens[i], one);
        cr_expect(memcmp(one, want + i * KVIDX_BLAKE3_OUT_LEN, sizeof(one)) == 0,
                  "input %zu (%zu bytes) differs from b3sum", i, lens[i]);
        for (int round = 0; round < 4; round++) {
            hash_in_pieces(&seed, in[i], lens[i], 1 + round * 7, split, sizeof(split));
            cr_expect(memcmp(one, split, sizeof(one)) == 0,
                      "input %zu (%zu bytes): updates cut at random points differ", i, lens[i]);
        }
        free((void *)in[i]);
    }
}

Test(blake3, one_byte_updates_across_block_and_chunk_edges)
{
    static const size_t lens[] = {63,   64,   65,   127,  128,  129,  1023, 1024,
                                  1025, 2047, 2048, 2049, 3072, 4097, 16385};
    uint64_t seed = 7;
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        uint8_t *p = malloc(lens[i]);
        cr_assert(p != NULL);
        fill_random(&seed, p, lens[i]);
        uint8_t one[100], bytewise[100];
        kvidx_blake3_t h;
        kvidx_blake3_init(&h);
        kvidx_blake3_update(&h, p, lens[i]);
        kvidx_blake3_final(&h, one, sizeof(one));
        kvidx_blake3_init(&h);
        for (size_t j = 0; j < lens[i]; j++)
            kvidx_blake3_update(&h, p + j, 1);
        kvidx_blake3_final(&h, bytewise, sizeof(bytewise));
        cr_expect(memcmp(one, bytewise, sizeof(one)) == 0, "%zu bytes fed one at a time differ",
                  lens[i]);
        free(p);
    }
}

Test(blake3, large_input_in_odd_pieces)
{
    const size_t len = 4 * 1024 * 1024 + 1;
    uint64_t seed = 4;
    uint8_t *p = malloc(len);
    cr_assert(p != NULL);
    fill_random(&seed, p, len);
    uint8_t want[KVIDX_BLAKE3_OUT_LEN], got[KVIDX_BLAKE3_OUT_LEN];
    b3sum_one(p, len, sizeof(want), want);
    kvidx_blake3(p, len, got);
    cr_expect(memcmp(got, want, sizeof(got)) == 0, "4 MiB + 1 byte differs from b3sum");
    kvidx_blake3_t h;
    kvidx_blake3_init(&h);
    for (size_t done = 0; done < len; done += 4093)
        kvidx_blake3_update(&h, p + done, len - done < 4093 ? len - done : 4093);
    kvidx_blake3_final(&h, got, sizeof(got));
    cr_expect(memcmp(got, want, sizeof(got)) == 0, "4 MiB + 1 byte in 4093-byte pieces differs");
    free(p);
}

Test(blake3, xof_lengths_against_b3sum)
{
    static const size_t input_lens[] = {0, 3, 1024, 5000};
    static const size_t out_lens[] = {1, 31, 32, 33, 63, 64, 65, 128, 129, 1000, 4096};
    uint64_t seed = 131;
    for (size_t i = 0; i < sizeof(input_lens) / sizeof(input_lens[0]); i++) {
        uint8_t *p = malloc(input_lens[i] + 1);
        cr_assert(p != NULL);
        fill_random(&seed, p, input_lens[i]);
        kvidx_blake3_t h;
        kvidx_blake3_init(&h);
        kvidx_blake3_update(&h, p, input_lens[i]);
        uint8_t longest[4096];
        kvidx_blake3_final(&h, longest, sizeof(longest));
        for (size_t j = 0; j < sizeof(out_lens) / sizeof(out_lens[0]); j++) {
            uint8_t want[4096], got[4096];
            b3sum_one(p, input_lens[i], out_lens[j], want);
            kvidx_blake3_final(&h, got, out_lens[j]);
            cr_expect(memcmp(got, want, out_lens[j]) == 0,
                      "%zu output bytes of a %zu-byte input differ from b3sum", out_lens[j],
                      input_lens[i]);
            cr_expect(memcmp(got, longest, out_lens[j]) == 0,
                      "%zu output bytes are not a prefix of the 4096-byte output", out_lens[j]);
        }
        free(p);
    }
}

Test(blake3, final_leaves_the_hasher_usable)
{
    uint64_t seed = 99;
    uint8_t p[3000];
    fill_random(&seed, p, sizeof(p));
    kvidx_blake3_t h;
    kvidx_blake3_init(&h);
    kvidx_blake3_update(&h, p, 1500);
    uint8_t first[KVIDX_BLAKE3_OUT_LEN], again[KVIDX_BLAKE3_OUT_LEN], whole[KVIDX_BLAKE3_OUT_LEN];
    kvidx_blake3_final(&h, first, sizeof(first));
    kvidx_blake3_final(&h, again, sizeof(again));
    cr_expect(memcmp(first, again, sizeof(first)) == 0, "a second final gives another value");
    uint8_t half[KVIDX_BLAKE3_OUT_LEN];
    kvidx_blake3(p, 1500, half);
    cr_expect(memcmp(first, half, sizeof(first)) == 0);
    kvidx_blake3_update(&h, p + 1500, sizeof(p) - 1500);
    kvidx_blake3_final(&h, whole, sizeof(whole));
    uint8_t want[KVIDX_BLAKE3_OUT_LEN];
    b3sum_one(p, sizeof(p), sizeof(want), want);
    cr_expect(memcmp(whole, want, sizeof(whole)) == 0, "update after final differs from b3sum");
}
