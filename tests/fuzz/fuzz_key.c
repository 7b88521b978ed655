/*
 * libFuzzer target for the key codec (lib/key.c).
 *
 * The input is fed to both string parsers as is, and also cut into the five
 * raw members of a key object for kvidx_key_from_input. Every key that is
 * accepted must survive encode -> parse unchanged in the canonical form, and
 * in the FS form too unless its model is one of the names the FS spelling
 * cannot carry (docs/keys.md); the encoders' size reports are checked on
 * the way. Any mismatch aborts so that libFuzzer records the input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvidx/err.h"
#include "kvidx/key.h"

/* A model containing "-SEP-" or "-SEP/" reads back differently from the FS
 * form: the first is LMCache's own flaw, the second makes the '-' before an
 * encoded '/' start a spurious "-SEP-". */
static int fs_lossy(const kvidx_key_t *k)
{
    for (size_t i = 0; i + 5 <= k->model_len; i++)
        if (memcmp(k->model + i, "-SEP", 4) == 0 &&
            (k->model[i + 4] == '-' || k->model[i + 4] == '/'))
            return 1;
    return 0;
}

static void check_encoding(const kvidx_key_t *k, int fs)
{
    char buf[KVIDX_KEY_STR_MAX];
    size_t need = 0;
    int rc = fs ? kvidx_key_encode_fs(k, NULL, &need) : kvidx_key_encode_canonical(k, NULL, &need);
    if (rc != KVIDX_ENOBUFS || need == 0 || need > sizeof(buf))
        abort();
    size_t size = need - 1;
    rc = fs ? kvidx_key_encode_fs(k, buf, &size) : kvidx_key_encode_canonical(k, buf, &size);
    if (rc != KVIDX_ENOBUFS || size != need)
        abort();
    size = sizeof(buf);
    rc = fs ? kvidx_key_encode_fs(k, buf, &size) : kvidx_key_encode_canonical(k, buf, &size);
    if (rc != 0 || size + 1 != need || buf[size] != '\0' || memchr(buf, '\0', size) != NULL)
        abort();

    kvidx_key_t back;
    char model_buf[KVIDX_MODEL_MAX + 1];
    kvidx_reason_t why;
    rc = fs ? kvidx_key_parse_fs(buf, size, &back, model_buf, &why)
            : kvidx_key_parse_canonical(buf, size, &back, &why);
    if (rc != 0)
        abort();
    if (!kvidx_key_equal(&back, k) || kvidx_key_cmp(&back, k) != 0)
        abort();
}

static void check_key(const kvidx_key_t *k)
{
    /* Every accepted key satisfies the field rules again on its own. */
    if (kvidx_key_check_model(k->model, k->model_len, NULL) != 0 ||
        kvidx_key_check_salt(k->salt, k->salt_len, NULL) != 0 || k->hash_len < KVIDX_HASH_MIN ||
        k->hash_len > KVIDX_HASH_MAX)
        abort();
    check_encoding(k, 0);
    if (!fs_lossy(k))
        check_encoding(k, 1);
}

/* Derives one member from a piece of the input; kind selects absent,
 * string, number or other. A number comes from 8 raw bytes when the piece
 * has exactly 8 (reaching NaN, infinities, fractions), else from strtod. */
static void make_field(kvidx_field_t *f, unsigned kind, const char *p, size_t n, char *scratch)
{
    memset(f, 0, sizeof(*f));
    switch (kind & 3) {
    case 0:
        f->kind = KVIDX_FIELD_ABSENT;
        break;
    case 1:
        f->kind = KVIDX_FIELD_STRING;
        f->str = p;
        f->len = n;
        break;
    case 2:
        f->kind = KVIDX_FIELD_NUMBER;
        if (n == sizeof(double)) {
            memcpy(&f->num, p, sizeof(double));
        } else {
            size_t m = n < 63 ? n : 63;
            memcpy(scratch, p, m);
            scratch[m] = '\0';
            f->num = strtod(scratch, NULL);
        }
        break;
    default:
        f->kind = KVIDX_FIELD_OTHER;
        break;
    }
}

static void fuzz_input(const uint8_t *data, size_t size)
{
    if (size < 2)
        return;
    unsigned flags = (unsigned)data[0] | (unsigned)data[1] << 8;
    const char *s = (const char *)data + 2;
    size_t n = size - 2;

    /* Five pieces separated by 0x1e (record separator). */
    const char *p[5];
    size_t len[5];
    size_t start = 0;
    int count = 0;
    for (size_t i = 0; i <= n && count < 5; i++) {
        if (i < n && s[i] != '\x1e')
            continue;
        p[count] = s + start;
        len[count] = i - start;
        count++;
        start = i + 1;
    }
    for (; count < 5; count++) {
        p[count] = s + n;
        len[count] = 0;
    }

    kvidx_key_input_t in;
    memset(&in, 0, sizeof(in));
    char scratch[64];
    make_field(&in.chunk_hash_hex, flags, p[0], len[0], scratch);
    make_field(&in.model_name, flags >> 2, p[1], len[1], scratch);
    make_field(&in.kv_rank, flags >> 4, p[2], len[2], scratch);
    make_field(&in.object_group_id, flags >> 6, p[3], len[3], scratch);
    make_field(&in.cache_salt, flags >> 8, p[4], len[4], scratch);
    in.has_unknown_member = (flags >> 10) & 1;

    kvidx_key_t k;
    kvidx_reason_t why = {NULL, NULL};
    int rc = kvidx_key_from_input(&in, &k, &why);
    if (rc != 0) {
        if (rc != KVIDX_EKEY || why.field == NULL || why.rule == NULL)
            abort();
        return;
    }
    /* What was accepted is exactly what was given: nothing truncated. */
    if (in.has_unknown_member || in.kv_rank.num != (double)k.kv_rank ||
        (in.object_group_id.kind == KVIDX_FIELD_NUMBER && in.object_group_id.num != k.group) ||
        k.model != in.model_name.str || k.model_len != in.model_name.len ||
        2 * (size_t)k.hash_len != in.chunk_hash_hex.len)
        abort();
    check_key(&k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    kvidx_key_t k;
    kvidx_reason_t why = {NULL, NULL};
    int rc = kvidx_key_parse_canonical(s, size, &k, &why);
    if (rc == 0)
        check_key(&k);
    else if (rc != KVIDX_EKEY || why.field == NULL || why.rule == NULL)
        abort();

    char model_buf[KVIDX_MODEL_MAX + 1];
    why.field = why.rule = NULL;
    rc = kvidx_key_parse_fs(s, size, &k, model_buf, &why);
    if (rc == 0)
        check_key(&k);
    else if (rc != KVIDX_EKEY || why.field == NULL || why.rule == NULL)
        abort();

    fuzz_input(data, size);
    return 0;
}
