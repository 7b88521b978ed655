/*
 * libFuzzer target for the persistence readers (kvidx/journal.h). The first
 * input byte picks what the rest is:
 *  0: a journal body. Reading must never crash; every record read must
 *     re-encode to exactly the bytes it was read from (the format has one
 *     encoding per record), and the reader must stop inside the input. A
 *     KEYS record read must hand out exactly its count of key states, each
 *     in its namespace.
 *  1: a journal header.
 *  2: a snapshot, taken as is (nearly always refused by its checksum).
 *  3: a snapshot whose trailer checksum is recomputed first, so that the
 *     fuzzer reaches the record parser behind it: reading must never crash,
 *     and keys must come with a namespace.
 * Snapshots are read by both readers (checksum first, streaming), which
 * must agree record for record and end the same way.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvidx/err.h"
#include "kvidx/journal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

static void keys_states(const kvidx_jrec_t *rec)
{
    kvidx_jrec_t k;
    size_t pos = 0;
    uint32_t n = 0;
    int rc;
    while ((rc = kvidx_jkeys_next(rec, &pos, &k)) == 1) {
        check(k.type == KVIDX_JREC_KEY && k.key.model == rec->key.model &&
              k.key.model_len == rec->key.model_len && k.key.salt_len == rec->key.salt_len);
        check(kvidx_jrec_size(&k) != 0);
        n++;
    }
    check(rc == 0 && n == rec->count && pos == rec->blob_len);
}

static void journal(const uint8_t *p, size_t n)
{
    size_t off = 0;
    kvidx_jrec_t rec;
    int rc;
    static uint8_t out[KVIDX_JREC_PAYLOAD_MAX + KVIDX_JREC_HDR_LEN];
    for (;;) {
        size_t start = off;
        rc = kvidx_journal_next(p, n, &off, &rec);
        if (rc != 1)
            break;
        check(off > start && off <= n);
        size_t len = 0;
        check(kvidx_jrec_encode(&rec, out, sizeof(out), &len) == 0);
        check(len == off - start);
        check(memcmp(out, p + start, len) == 0);
        if (rec.type == KVIDX_JREC_KEYS)
            keys_states(&rec);
    }
    check(rc == 0 || rc == KVIDX_EINVAL);
    check(off <= n);
    if (rc == 0)
        check(off == n);
}

/* Reads a snapshot with both readers: the one that checks the file
 * checksum first and the streaming one that checks it at the end. They
 * must hand out the same records and end the same way; the streaming one
 * may hand out records of a damaged file, but never end it with 0. */
static void snapshot(const uint8_t *p, size_t n)
{
    kvidx_snapshot_reader_t r, s;
    const char *why = NULL, *swhy = NULL;
    int ok = kvidx_snapshot_open(&r, p, n, &why) == 0;
    int sok = kvidx_snapshot_open_streaming(&s, p, n, &swhy) == 0;
    check(ok || why != NULL);
    check(sok || swhy != NULL);
    check(sok || !ok);
    if (!sok)
        return;
    kvidx_jrec_t rec, srec;
    int rc = ok ? 1 : KVIDX_EINVAL, src;
    uint64_t keys = 0;
    while ((src = kvidx_snapshot_next(&s, &srec)) == 1) {
        check(srec.type == KVIDX_JREC_KEY || srec.type == KVIDX_JREC_LAYOUT_PUT ||
              srec.type == KVIDX_JREC_DIR);
        if (srec.type == KVIDX_JREC_KEY) {
            check(srec.tiers != 0 && srec.key.model_len >= 1);
            keys++;
        }
        if (ok) {
            rc = kvidx_snapshot_next(&r, &rec);
            check(rc == 1 && rec.type == srec.type && rec.size_bytes == srec.size_bytes &&
                  rec.tiers == srec.tiers);
            if (rec.type == KVIDX_JREC_KEY)
                check(kvidx_key_equal(&rec.key, &srec.key));
        }
    }
    check(src == 0 || (src == KVIDX_EINVAL && s.why != NULL));
    if (ok)
        rc = kvidx_snapshot_next(&r, &rec);
    check(rc == 0 || rc == KVIDX_EINVAL);
    check(src == rc);
    /* Both endings repeat. */
    check(kvidx_snapshot_next(&s, &srec) == src);
    if (src == 0)
        check(keys == s.keys);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0] & 3;
    data++;
    size--;
    uint64_t gen;
    switch (mode) {
    case 0:
        journal(data, size);
        break;
    case 1:
        if (kvidx_journal_header_decode(data, size, &gen) == 0)
            check(size >= KVIDX_JOURNAL_HEADER_LEN);
        break;
    case 2:
        snapshot(data, size);
        break;
    default: {
        uint8_t *copy = malloc(size ? size : 1);
        if (!copy)
            return 0;
        memcpy(copy, data, size);
        if (size >= KVIDX_SNAPSHOT_HEADER_LEN + KVIDX_SNAPSHOT_TRAILER_LEN) {
            uint32_t c = kvidx_crc32c(0, copy, size - 8);
            for (int i = 0; i < 4; i++)
                copy[size - 8 + (size_t)i] = (uint8_t)(c >> (8 * i));
        }
        snapshot(copy, size);
        free(copy);
    }
    }
    return 0;
}
