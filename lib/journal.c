/*
 * The journal and snapshot formats (see kvidx/journal.h for the layouts):
 * CRC32C, record framing, the key/layout payloads, a journal reader that
 * stops at the first torn or corrupt byte, and a snapshot writer/reader
 * whose trailer checksum covers the whole file.
 *
 * Invariants: every decoder bounds-checks before it reads, never trusts a
 * length from the buffer beyond KVIDX_JREC_PAYLOAD_MAX or the bytes
 * present, and accepts a payload only when it is exactly as long as its
 * fields say (a KEYS record: exactly as many states as its count, each
 * valid). Decoded keys pass the same shape checks the index applies
 * (lengths, size range), so a replayed record can always be applied. No
 * I/O, no allocation, no global mutable state.
 */
#include "kvidx/journal.h"

#include "kvidx/err.h"

#include <string.h>

static const uint32_t crc_table[256] = {
    0x00000000u, 0xf26b8303u, 0xe13b70f7u, 0x1350f3f4u, 0xc79a971fu, 0x35f1141cu, 0x26a1e7e8u,
    0xd4ca64ebu, 0x8ad958cfu, 0x78b2dbccu, 0x6be22838u, 0x9989ab3bu, 0x4d43cfd0u, 0xbf284cd3u,
    0xac78bf27u, 0x5e133c24u, 0x105ec76fu, 0xe235446cu, 0xf165b798u, 0x030e349bu, 0xd7c45070u,
    0x25afd373u, 0x36ff2087u, 0xc494a384u, 0x9a879fa0u, 0x68ec1ca3u, 0x7bbcef57u, 0x89d76c54u,
    0x5d1d08bfu, 0xaf768bbcu, 0xbc267848u, 0x4e4dfb4bu, 0x20bd8edeu, 0xd2d60dddu, 0xc186fe29u,
    0x33ed7d2au, 0xe72719c1u, 0x154c9ac2u, 0x061c6936u, 0xf477ea35u, 0xaa64d611u, 0x580f5512u,
    0x4b5fa6e6u, 0xb93425e5u, 0x6dfe410eu, 0x9f95c20du, 0x8cc531f9u, 0x7eaeb2fau, 0x30e349b1u,
    0xc288cab2u, 0xd1d83946u, 0x23b3ba45u, 0xf779deaeu, 0x05125dadu, 0x1642ae59u, 0xe4292d5au,
    0xba3a117eu, 0x4851927du, 0x5b016189u, 0xa96ae28au, 0x7da08661u, 0x8fcb0562u, 0x9c9bf696u,
    0x6ef07595u, 0x417b1dbcu, 0xb3109ebfu, 0xa0406d4bu, 0x522bee48u, 0x86e18aa3u, 0x748a09a0u,
    0x67dafa54u, 0x95b17957u, 0xcba24573u, 0x39c9c670u, 0x2a993584u, 0xd8f2b687u, 0x0c38d26cu,
    0xfe53516fu, 0xed03a29bu, 0x1f682198u, 0x5125dad3u, 0xa34e59d0u, 0xb01eaa24u, 0x42752927u,
    0x96bf4dccu, 0x64d4cecfu, 0x77843d3bu, 0x85efbe38u, 0xdbfc821cu, 0x2997011fu, 0x3ac7f2ebu,
    0xc8ac71e8u, 0x1c661503u, 0xee0d9600u, 0xfd5d65f4u, 0x0f36e6f7u, 0x61c69362u, 0x93ad1061u,
    0x80fde395u, 0x72966096u, 0xa65c047du, 0x5437877eu, 0x4767748au, 0xb50cf789u, 0xeb1fcbadu,
    0x197448aeu, 0x0a24bb5au, 0xf84f3859u, 0x2c855cb2u, 0xdeeedfb1u, 0xcdbe2c45u, 0x3fd5af46u,
    0x7198540du, 0x83f3d70eu, 0x90a324fau, 0x62c8a7f9u, 0xb602c312u, 0x44694011u, 0x5739b3e5u,
    0xa55230e6u, 0xfb410cc2u, 0x092a8fc1u, 0x1a7a7c35u, 0xe811ff36u, 0x3cdb9bddu, 0xceb018deu,
    0xdde0eb2au, 0x2f8b6829u, 0x82f63b78u, 0x709db87bu, 0x63cd4b8fu, 0x91a6c88cu, 0x456cac67u,
    0xb7072f64u, 0xa457dc90u, 0x563c5f93u, 0x082f63b7u, 0xfa44e0b4u, 0xe9141340u, 0x1b7f9043u,
    0xcfb5f4a8u, 0x3dde77abu, 0x2e8e845fu, 0xdce5075cu, 0x92a8fc17u, 0x60c37f14u, 0x73938ce0u,
    0x81f80fe3u, 0x55326b08u, 0xa759e80bu, 0xb4091bffu, 0x466298fcu, 0x1871a4d8u, 0xea1a27dbu,
    0xf94ad42fu, 0x0b21572cu, 0xdfeb33c7u, 0x2d80b0c4u, 0x3ed04330u, 0xccbbc033u, 0xa24bb5a6u,
    0x502036a5u, 0x4370c551u, 0xb11b4652u, 0x65d122b9u, 0x97baa1bau, 0x84ea524eu, 0x7681d14du,
    0x2892ed69u, 0xdaf96e6au, 0xc9a99d9eu, 0x3bc21e9du, 0xef087a76u, 0x1d63f975u, 0x0e330a81u,
    0xfc588982u, 0xb21572c9u, 0x407ef1cau, 0x532e023eu, 0xa145813du, 0x758fe5d6u, 0x87e466d5u,
    0x94b49521u, 0x66df1622u, 0x38cc2a06u, 0xcaa7a905u, 0xd9f75af1u, 0x2b9cd9f2u, 0xff56bd19u,
    0x0d3d3e1au, 0x1e6dcdeeu, 0xec064eedu, 0xc38d26c4u, 0x31e6a5c7u, 0x22b65633u, 0xd0ddd530u,
    0x0417b1dbu, 0xf67c32d8u, 0xe52cc12cu, 0x1747422fu, 0x49547e0bu, 0xbb3ffd08u, 0xa86f0efcu,
    0x5a048dffu, 0x8ecee914u, 0x7ca56a17u, 0x6ff599e3u, 0x9d9e1ae0u, 0xd3d3e1abu, 0x21b862a8u,
    0x32e8915cu, 0xc083125fu, 0x144976b4u, 0xe622f5b7u, 0xf5720643u, 0x07198540u, 0x590ab964u,
    0xab613a67u, 0xb831c993u, 0x4a5a4a90u, 0x9e902e7bu, 0x6cfbad78u, 0x7fab5e8cu, 0x8dc0dd8fu,
    0xe330a81au, 0x115b2b19u, 0x020bd8edu, 0xf0605beeu, 0x24aa3f05u, 0xd6c1bc06u, 0xc5914ff2u,
    0x37faccf1u, 0x69e9f0d5u, 0x9b8273d6u, 0x88d28022u, 0x7ab90321u, 0xae7367cau, 0x5c18e4c9u,
    0x4f48173du, 0xbd23943eu, 0xf36e6f75u, 0x0105ec76u, 0x12551f82u, 0xe03e9c81u, 0x34f4f86au,
    0xc69f7b69u, 0xd5cf889du, 0x27a40b9eu, 0x79b737bau, 0x8bdcb4b9u, 0x988c474du, 0x6ae7c44eu,
    0xbe2da0a5u, 0x4c4623a6u, 0x5f16d052u, 0xad7d5351u,
};

static uint32_t crc_sw(uint32_t c, const uint8_t *p, size_t n)
{
    while (n--)
        c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const uint8_t *p, size_t n)
{
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    while (n--)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}

static int have_hw(void)
{
    return __builtin_cpu_supports("sse4.2");
}
#else
static uint32_t crc_hw(uint32_t c, const uint8_t *p, size_t n)
{
    return crc_sw(c, p, n);
}

static int have_hw(void)
{
    return 0;
}
#endif

uint32_t kvidx_crc32c(uint32_t crc, const void *p, size_t n)
{
    uint32_t c = ~crc;
    c = have_hw() ? crc_hw(c, p, n) : crc_sw(c, p, n);
    return ~c;
}

/* ---- little-endian helpers ---- */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static const char journal_magic[8] = {'K', 'V', 'I', 'D', 'X', 'J', 'N', 'L'};
static const char snapshot_magic[8] = {'K', 'V', 'I', 'D', 'X', 'S', 'N', 'P'};
static const char trailer_magic[8] = {'K', 'V', 'I', 'D', 'X', 'E', 'N', 'D'};

static void file_header(const char magic[8], uint32_t version, uint64_t gen, uint8_t out[32])
{
    memset(out, 0, 32);
    memcpy(out, magic, 8);
    put32(out + 8, version);
    put64(out + 16, gen);
    put32(out + 24, kvidx_crc32c(0, out, 24));
}

/* The version must be one of [oldest, newest]. */
static int file_header_check(const char magic[8], uint32_t oldest, uint32_t newest,
                             const uint8_t *p, size_t n, uint64_t *gen)
{
    if (n < 32 || memcmp(p, magic, 8) != 0 || get32(p + 8) < oldest || get32(p + 8) > newest ||
        get32(p + 12) != 0 || get32(p + 24) != kvidx_crc32c(0, p, 24) || get32(p + 28) != 0)
        return KVIDX_EINVAL;
    *gen = get64(p + 16);
    return 0;
}

void kvidx_journal_header_encode(uint64_t generation, uint8_t out[KVIDX_JOURNAL_HEADER_LEN])
{
    file_header(journal_magic, KVIDX_JOURNAL_VERSION, generation, out);
}

int kvidx_journal_header_decode(const uint8_t *p, size_t n, uint64_t *generation)
{
    return file_header_check(journal_magic, 1, KVIDX_JOURNAL_VERSION, p, n, generation);
}

/* ---- payloads ---- */

/* KEY: type, tiers, model_len, salt_len, hash_len, group u16, rank u32,
 *      size u64, model, salt, hash
 * LAYOUT_PUT/DEL: type, world_size, model_len, model, [blob]
 * NS: type, model_len, salt_len, model, salt
 * SKEY: type, state
 * KEYS: type, model_len, salt_len, count u32, model, salt, count states
 * DIR: type, blob (1..KVIDX_JREC_DIR_BLOB_MAX bytes)
 * BEGIN, COMMIT: type
 * where a state is: tiers, hash_len, group u16, rank u32, size u64, hash */
#define KEY_FIXED   19
#define LAY_FIXED   3
#define NS_FIXED    3
#define STATE_FIXED KVIDX_JKEYS_STATE_FIXED
#define SKEY_FIXED  (1 + STATE_FIXED)
#define KEYS_FIXED  KVIDX_JKEYS_FIXED

static int state_ok(uint8_t tiers, uint64_t size, int allow_gone)
{
    if (tiers > (KVIDX_STATE_L1 | KVIDX_STATE_L2))
        return 0;
    if (tiers == 0)
        return allow_gone && size == 0;
    return size >= 1 && size <= ((uint64_t)1 << 40);
}

static int hash_ok(uint8_t hl)
{
    return hl >= KVIDX_HASH_MIN && hl <= KVIDX_HASH_MAX;
}

static int model_ok(size_t ml)
{
    return ml >= 1 && ml <= KVIDX_MODEL_MAX;
}

static int ns_ok(size_t ml, size_t sl)
{
    return model_ok(ml) && sl <= KVIDX_SALT_MAX;
}

/* Writes the state of KEY record *r (its key's rank, group and hash, its
 * tiers and size) at q: STATE_FIXED + hash_len bytes. */
static void state_put(uint8_t *q, const kvidx_jrec_t *r)
{
    const kvidx_key_t *k = &r->key;
    q[0] = r->tiers;
    q[1] = k->hash_len;
    put16(q + 2, k->group);
    put32(q + 4, k->kv_rank);
    put64(q + 8, r->size_bytes);
    memcpy(q + STATE_FIXED, k->hash, k->hash_len);
}

/* Reads the state at p[0..n) into *rec: its bytes, or 0 when they are not
 * a whole valid state (allow_gone: tiers 0 is one). */
static size_t state_get(const uint8_t *p, size_t n, kvidx_jrec_t *rec, int allow_gone)
{
    if (n < STATE_FIXED)
        return 0;
    kvidx_key_t *k = &rec->key;
    rec->tiers = p[0];
    k->hash_len = p[1];
    k->group = get16(p + 2);
    k->kv_rank = get32(p + 4);
    rec->size_bytes = get64(p + 8);
    if (!hash_ok(k->hash_len) || !state_ok(rec->tiers, rec->size_bytes, allow_gone) ||
        n - STATE_FIXED < k->hash_len)
        return 0;
    memcpy(k->hash, p + STATE_FIXED, k->hash_len);
    return (size_t)STATE_FIXED + k->hash_len;
}

/* 1 when states[0..n) is exactly count (>= 1) valid states. */
static int states_ok(const uint8_t *states, size_t n, uint32_t count)
{
    kvidx_jrec_t rec;
    size_t off = 0;
    if (count == 0 || !states)
        return 0;
    for (uint32_t i = 0; i < count; i++) {
        size_t w = state_get(states + off, n - off, &rec, 1);
        if (!w)
            return 0;
        off += w;
    }
    return off == n;
}

static size_t payload_size(const kvidx_jrec_t *r)
{
    const kvidx_key_t *k = &r->key;
    switch (r->type) {
    case KVIDX_JREC_KEY:
        if (!ns_ok(k->model_len, k->salt_len) || !hash_ok(k->hash_len) ||
            !state_ok(r->tiers, r->size_bytes, 1))
            return 0;
        return KEY_FIXED + k->model_len + k->salt_len + k->hash_len;
    case KVIDX_JREC_LAYOUT_PUT:
    case KVIDX_JREC_LAYOUT_DEL:
        if (!model_ok(k->model_len) || r->world_size == 0)
            return 0;
        if (r->type == KVIDX_JREC_LAYOUT_DEL)
            return LAY_FIXED + k->model_len;
        if (r->blob_len > KVIDX_JREC_PAYLOAD_MAX - LAY_FIXED - KVIDX_MODEL_MAX)
            return 0;
        return LAY_FIXED + k->model_len + r->blob_len;
    case KVIDX_JREC_DIR:
        if (r->blob_len < 1 || r->blob_len > KVIDX_JREC_DIR_BLOB_MAX || !r->blob)
            return 0;
        return 1 + r->blob_len;
    case KVIDX_JREC_BEGIN:
    case KVIDX_JREC_COMMIT:
        return 1;
    case KVIDX_JREC_KEYS:
        if (!ns_ok(k->model_len, k->salt_len) || !states_ok(r->blob, r->blob_len, r->count) ||
            r->blob_len > KVIDX_JREC_PAYLOAD_MAX - KEYS_FIXED - k->model_len - k->salt_len)
            return 0;
        return KEYS_FIXED + k->model_len + k->salt_len + r->blob_len;
    default:
        return 0;
    }
}

size_t kvidx_jrec_size(const kvidx_jrec_t *r)
{
    size_t n = payload_size(r);
    return n ? KVIDX_JREC_HDR_LEN + n : 0;
}

/* Frames payload out[8..8+n): writes len and crc. */
static void frame(uint8_t *out, size_t n)
{
    put32(out, (uint32_t)n);
    put32(out + 4, kvidx_crc32c(kvidx_crc32c(0, out, 4), out + 8, n));
}

/* Writes a KEYS payload's type, namespace and count at p: the end. */
static uint8_t *ns_put(uint8_t *p, const kvidx_key_t *k, uint32_t count)
{
    p[0] = KVIDX_JREC_KEYS;
    p[1] = (uint8_t)k->model_len;
    p[2] = k->salt_len;
    put32(p + 3, count);
    p += KEYS_FIXED;
    memcpy(p, k->model, k->model_len);
    p += k->model_len;
    if (k->salt_len)
        memcpy(p, k->salt, k->salt_len);
    return p + k->salt_len;
}

int kvidx_jrec_encode(const kvidx_jrec_t *r, uint8_t *out, size_t cap, size_t *len)
{
    size_t n = payload_size(r);
    if (!n)
        return KVIDX_EINVAL;
    *len = KVIDX_JREC_HDR_LEN + n;
    if (cap < *len)
        return KVIDX_ENOBUFS;
    uint8_t *p = out + KVIDX_JREC_HDR_LEN;
    const kvidx_key_t *k = &r->key;
    p[0] = (uint8_t)r->type;
    if (r->type == KVIDX_JREC_KEY) {
        p[1] = r->tiers;
        p[2] = (uint8_t)k->model_len;
        p[3] = k->salt_len;
        p[4] = k->hash_len;
        put16(p + 5, k->group);
        put32(p + 7, k->kv_rank);
        put64(p + 11, r->size_bytes);
        p += KEY_FIXED;
        memcpy(p, k->model, k->model_len);
        p += k->model_len;
        if (k->salt_len)
            memcpy(p, k->salt, k->salt_len);
        p += k->salt_len;
        memcpy(p, k->hash, k->hash_len);
    } else if (r->type == KVIDX_JREC_DIR) {
        memcpy(p + 1, r->blob, r->blob_len);
    } else if (r->type == KVIDX_JREC_KEYS) {
        uint8_t *q = ns_put(p, k, r->count);
        memcpy(q, r->blob, r->blob_len);
    } else if (r->type == KVIDX_JREC_BEGIN || r->type == KVIDX_JREC_COMMIT) {
        /* the type byte is the whole payload */
    } else {
        p[1] = r->world_size;
        p[2] = (uint8_t)k->model_len;
        memcpy(p + LAY_FIXED, k->model, k->model_len);
        if (r->type == KVIDX_JREC_LAYOUT_PUT && r->blob_len)
            memcpy(p + LAY_FIXED + k->model_len, r->blob, r->blob_len);
    }
    frame(out, n);
    return 0;
}

/* Decodes one payload of any type into *rec; 0 or KVIDX_EINVAL. */
static int payload_decode(const uint8_t *p, size_t n, kvidx_jrec_t *rec)
{
    memset(rec, 0, sizeof(*rec));
    if (n < 1)
        return KVIDX_EINVAL;
    rec->type = (kvidx_jrec_type_t)p[0];
    kvidx_key_t *k = &rec->key;
    switch (p[0]) {
    case KVIDX_JREC_KEY:
        if (n < KEY_FIXED)
            return KVIDX_EINVAL;
        rec->tiers = p[1];
        k->model_len = p[2];
        k->salt_len = p[3];
        k->hash_len = p[4];
        k->group = get16(p + 5);
        k->kv_rank = get32(p + 7);
        rec->size_bytes = get64(p + 11);
        if (!ns_ok(k->model_len, k->salt_len) || !hash_ok(k->hash_len) ||
            !state_ok(rec->tiers, rec->size_bytes, 1) ||
            n != (size_t)KEY_FIXED + k->model_len + k->salt_len + k->hash_len)
            return KVIDX_EINVAL;
        k->model = (const char *)p + KEY_FIXED;
        k->salt = k->model + k->model_len;
        memcpy(k->hash, k->salt + k->salt_len, k->hash_len);
        return 0;
    case KVIDX_JREC_LAYOUT_PUT:
    case KVIDX_JREC_LAYOUT_DEL:
        if (n < LAY_FIXED)
            return KVIDX_EINVAL;
        rec->world_size = p[1];
        k->model_len = p[2];
        if (rec->world_size == 0 || !model_ok(k->model_len) || n < (size_t)LAY_FIXED + p[2])
            return KVIDX_EINVAL;
        k->model = (const char *)p + LAY_FIXED;
        rec->blob = p + LAY_FIXED + k->model_len;
        rec->blob_len = n - LAY_FIXED - k->model_len;
        if (p[0] == KVIDX_JREC_LAYOUT_DEL && rec->blob_len)
            return KVIDX_EINVAL;
        if (p[0] == KVIDX_JREC_LAYOUT_DEL)
            rec->blob = NULL;
        return 0;
    case KVIDX_JREC_DIR:
        if (n < 2)
            return KVIDX_EINVAL;
        rec->blob = p + 1;
        rec->blob_len = n - 1;
        return 0;
    case KVIDX_JREC_BEGIN:
    case KVIDX_JREC_COMMIT:
        return n == 1 ? 0 : KVIDX_EINVAL;
    case KVIDX_JREC_NS:
        if (n < NS_FIXED)
            return KVIDX_EINVAL;
        k->model_len = p[1];
        k->salt_len = p[2];
        if (!ns_ok(k->model_len, k->salt_len) || n != (size_t)NS_FIXED + k->model_len + k->salt_len)
            return KVIDX_EINVAL;
        k->model = (const char *)p + NS_FIXED;
        k->salt = k->model + k->model_len;
        return 0;
    case KVIDX_JREC_SKEY:
        if (n < SKEY_FIXED)
            return KVIDX_EINVAL;
        return state_get(p + 1, n - 1, rec, 0) == n - 1 ? 0 : KVIDX_EINVAL;
    case KVIDX_JREC_KEYS:
        if (n < KEYS_FIXED)
            return KVIDX_EINVAL;
        k->model_len = p[1];
        k->salt_len = p[2];
        rec->count = get32(p + 3);
        if (!ns_ok(k->model_len, k->salt_len) ||
            n - KEYS_FIXED < (size_t)k->model_len + k->salt_len)
            return KVIDX_EINVAL;
        k->model = (const char *)p + KEYS_FIXED;
        k->salt = k->model + k->model_len;
        rec->blob = (const uint8_t *)k->salt + k->salt_len;
        rec->blob_len = n - KEYS_FIXED - k->model_len - k->salt_len;
        return states_ok(rec->blob, rec->blob_len, rec->count) ? 0 : KVIDX_EINVAL;
    default:
        return KVIDX_EINVAL;
    }
}

/* Unframes the record at buf[*off..len): 1 with payload span, 0 at end,
 * KVIDX_EINVAL when torn or corrupt. */
static int unframe(const uint8_t *buf, size_t len, size_t off, const uint8_t **payload, size_t *n,
                   int check_crc)
{
    if (off == len)
        return 0;
    if (off > len || len - off < KVIDX_JREC_HDR_LEN)
        return KVIDX_EINVAL;
    const uint8_t *h = buf + off;
    uint32_t plen = get32(h);
    if (plen == 0 || plen > KVIDX_JREC_PAYLOAD_MAX || len - off - KVIDX_JREC_HDR_LEN < plen)
        return KVIDX_EINVAL;
    if (check_crc &&
        kvidx_crc32c(kvidx_crc32c(0, h, 4), h + KVIDX_JREC_HDR_LEN, plen) != get32(h + 4))
        return KVIDX_EINVAL;
    *payload = h + KVIDX_JREC_HDR_LEN;
    *n = plen;
    return 1;
}

int kvidx_journal_next(const uint8_t *buf, size_t len, size_t *off, kvidx_jrec_t *rec)
{
    const uint8_t *p;
    size_t n;
    int rc = unframe(buf, len, *off, &p, &n, 1);
    if (rc <= 0)
        return rc;
    if (payload_decode(p, n, rec) != 0 || rec->type == KVIDX_JREC_NS ||
        rec->type == KVIDX_JREC_SKEY)
        return KVIDX_EINVAL;
    *off += KVIDX_JREC_HDR_LEN + n;
    return 1;
}

int kvidx_journal_group_end(const uint8_t *buf, size_t len, size_t off, size_t *end)
{
    kvidx_jrec_t rec;
    size_t at = off;
    while (kvidx_journal_next(buf, len, &off, &rec) == 1) {
        if (rec.type == KVIDX_JREC_BEGIN) {
            *end = at;
            return 2;
        }
        at = off;
        if (rec.type == KVIDX_JREC_COMMIT) {
            *end = off;
            return 1;
        }
    }
    return 0;
}

/* ---- KEYS records, one state at a time ---- */

size_t kvidx_jkeys_size(const kvidx_jrec_t *r)
{
    const kvidx_key_t *k = &r->key;
    if (r->type != KVIDX_JREC_KEY || !payload_size(r))
        return 0;
    return KVIDX_JREC_HDR_LEN + KEYS_FIXED + k->model_len + k->salt_len + STATE_FIXED + k->hash_len;
}

int kvidx_jkeys_begin(const kvidx_jrec_t *r, uint8_t *out, size_t cap, size_t *len)
{
    size_t n = kvidx_jkeys_size(r);
    if (!n)
        return KVIDX_EINVAL;
    *len = n;
    if (cap < n)
        return KVIDX_ENOBUFS;
    state_put(ns_put(out + KVIDX_JREC_HDR_LEN, &r->key, 1), r);
    put32(out, (uint32_t)(n - KVIDX_JREC_HDR_LEN));
    put32(out + 4, 0); /* the checksum: written by kvidx_jkeys_close */
    return 0;
}

size_t kvidx_jkeys_room(const uint8_t *rec, const kvidx_jrec_t *r)
{
    const kvidx_key_t *k = &r->key;
    const uint8_t *p = rec + KVIDX_JREC_HDR_LEN;
    size_t plen = get32(rec), add = (size_t)STATE_FIXED + k->hash_len;
    /* The record's namespace passed ns_ok when it was begun: equal
     * lengths make the key's pass it too. */
    if (r->type != KVIDX_JREC_KEY || !hash_ok(k->hash_len) ||
        !state_ok(r->tiers, r->size_bytes, 1) || p[1] != k->model_len || p[2] != k->salt_len ||
        plen > KVIDX_JREC_PAYLOAD_MAX || KVIDX_JREC_PAYLOAD_MAX - plen < add ||
        memcmp(p + KEYS_FIXED, k->model, k->model_len) != 0 ||
        (k->salt_len && memcmp(p + KEYS_FIXED + k->model_len, k->salt, k->salt_len) != 0))
        return 0;
    return add;
}

size_t kvidx_jkeys_add(uint8_t *rec, const kvidx_jrec_t *r)
{
    size_t add = kvidx_jkeys_room(rec, r);
    if (!add)
        return 0;
    uint8_t *p = rec + KVIDX_JREC_HDR_LEN;
    uint32_t plen = get32(rec);
    state_put(p + plen, r);
    put32(rec, plen + (uint32_t)add);
    put32(p + 3, get32(p + 3) + 1);
    return add;
}

void kvidx_jkeys_close(uint8_t *rec)
{
    frame(rec, get32(rec));
}

int kvidx_jkeys_next(const kvidx_jrec_t *batch, size_t *pos, kvidx_jrec_t *key)
{
    if (batch->type != KVIDX_JREC_KEYS || *pos > batch->blob_len)
        return KVIDX_EINVAL;
    /* The first call checks every state against the count, so that a
     * batch made by hand is refused whole, as the reader refuses one. */
    if (*pos == 0 && !states_ok(batch->blob, batch->blob_len, batch->count))
        return KVIDX_EINVAL;
    if (*pos == batch->blob_len)
        return 0;
    memset(key, 0, sizeof(*key));
    size_t w = state_get(batch->blob + *pos, batch->blob_len - *pos, key, 1);
    if (!w)
        return KVIDX_EINVAL;
    key->type = KVIDX_JREC_KEY;
    key->key.model = batch->key.model;
    key->key.model_len = batch->key.model_len;
    key->key.salt = batch->key.salt;
    key->key.salt_len = batch->key.salt_len;
    *pos += w;
    return 1;
}

/* ---- snapshot ---- */

void kvidx_snapshot_begin(kvidx_snapshot_writer_t *w, uint64_t next_generation,
                          uint8_t out[KVIDX_SNAPSHOT_HEADER_LEN])
{
    memset(w, 0, sizeof(*w));
    file_header(snapshot_magic, KVIDX_SNAPSHOT_VERSION, next_generation, out);
    w->crc = kvidx_crc32c(0, out, KVIDX_SNAPSHOT_HEADER_LEN);
}

int kvidx_snapshot_add(kvidx_snapshot_writer_t *w, const kvidx_jrec_t *r, uint8_t *out, size_t cap,
                       size_t *len)
{
    const kvidx_key_t *k = &r->key;
    size_t need, ns_len = 0;
    if (r->type == KVIDX_JREC_DIR) {
        int e = kvidx_jrec_encode(r, out, cap, len);
        if (e)
            return e;
        w->crc = kvidx_crc32c(w->crc, out, *len);
        return 0;
    }
    if (r->type == KVIDX_JREC_LAYOUT_PUT) {
        size_t rc = kvidx_jrec_size(r);
        if (!rc)
            return KVIDX_EINVAL;
        int e = kvidx_jrec_encode(r, out, cap, len);
        if (e)
            return e;
        w->crc = kvidx_crc32c(w->crc, out, *len);
        w->layouts++;
        return 0;
    }
    if (r->type != KVIDX_JREC_KEY || r->tiers == 0 || payload_size(r) == 0)
        return KVIDX_EINVAL;
    int new_ns = !w->has_ns || w->model_len != k->model_len || w->salt_len != k->salt_len ||
                 memcmp(w->model, k->model, k->model_len) != 0 ||
                 (k->salt_len && memcmp(w->salt, k->salt, k->salt_len) != 0);
    if (new_ns)
        ns_len = KVIDX_JREC_HDR_LEN + NS_FIXED + k->model_len + k->salt_len;
    need = ns_len + KVIDX_JREC_HDR_LEN + SKEY_FIXED + k->hash_len;
    *len = need;
    if (cap < need)
        return KVIDX_ENOBUFS;
    uint8_t *p = out;
    if (new_ns) {
        uint8_t *q = p + KVIDX_JREC_HDR_LEN;
        q[0] = KVIDX_JREC_NS;
        q[1] = (uint8_t)k->model_len;
        q[2] = k->salt_len;
        memcpy(q + NS_FIXED, k->model, k->model_len);
        if (k->salt_len)
            memcpy(q + NS_FIXED + k->model_len, k->salt, k->salt_len);
        frame(p, ns_len - KVIDX_JREC_HDR_LEN);
        p += ns_len;
        w->has_ns = 1;
        w->model_len = (uint8_t)k->model_len;
        w->salt_len = k->salt_len;
        memcpy(w->model, k->model, k->model_len);
        if (k->salt_len)
            memcpy(w->salt, k->salt, k->salt_len);
    }
    uint8_t *q = p + KVIDX_JREC_HDR_LEN;
    q[0] = KVIDX_JREC_SKEY;
    state_put(q + 1, r);
    frame(p, (size_t)SKEY_FIXED + k->hash_len);
    w->crc = kvidx_crc32c(w->crc, out, need);
    w->keys++;
    return 0;
}

void kvidx_snapshot_finish(kvidx_snapshot_writer_t *w, uint8_t out[KVIDX_SNAPSHOT_TRAILER_LEN])
{
    memset(out, 0, KVIDX_SNAPSHOT_TRAILER_LEN);
    memcpy(out, trailer_magic, 8);
    put64(out + 8, w->keys);
    put64(out + 16, w->layouts);
    put32(out + 24, kvidx_crc32c(w->crc, out, 24));
}

static int snapshot_open(kvidx_snapshot_reader_t *r, const uint8_t *buf, size_t len,
                         const char **why, int streaming)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    memset(r, 0, sizeof(*r));
    if (len < KVIDX_SNAPSHOT_HEADER_LEN + KVIDX_SNAPSHOT_TRAILER_LEN) {
        *why = "file too short for a header and a trailer";
        return KVIDX_EINVAL;
    }
    if (file_header_check(snapshot_magic, KVIDX_SNAPSHOT_VERSION, KVIDX_SNAPSHOT_VERSION, buf, len,
                          &r->next_generation) != 0) {
        *why = "bad header (magic, version or checksum)";
        return KVIDX_EINVAL;
    }
    const uint8_t *t = buf + len - KVIDX_SNAPSHOT_TRAILER_LEN;
    if (memcmp(t, trailer_magic, 8) != 0 || get32(t + 28) != 0) {
        *why = "no trailer: the file is truncated or damaged";
        return KVIDX_EINVAL;
    }
    if (!streaming && kvidx_crc32c(0, buf, len - 8) != get32(t + 24)) {
        *why = "checksum mismatch: the file is damaged";
        return KVIDX_EINVAL;
    }
    r->buf = buf;
    r->off = KVIDX_SNAPSHOT_HEADER_LEN;
    r->end = len - KVIDX_SNAPSHOT_TRAILER_LEN;
    r->keys = get64(t + 8);
    r->layouts = get64(t + 16);
    /* Bounded by the records that fit, so that a damaged count (which a
     * streaming reader has not checked yet) cannot ask for a huge index. */
    size_t body = r->end - r->off;
    if (r->keys > body / (KVIDX_JREC_HDR_LEN + SKEY_FIXED + KVIDX_HASH_MIN) ||
        r->layouts > body / (KVIDX_JREC_HDR_LEN + LAY_FIXED + 1)) {
        *why = "the trailer announces more records than the file holds";
        return KVIDX_EINVAL;
    }
    r->streaming = streaming;
    return 0;
}

int kvidx_snapshot_open(kvidx_snapshot_reader_t *r, const uint8_t *buf, size_t len,
                        const char **why)
{
    return snapshot_open(r, buf, len, why, 0);
}

int kvidx_snapshot_open_streaming(kvidx_snapshot_reader_t *r, const uint8_t *buf, size_t len,
                                  const char **why)
{
    return snapshot_open(r, buf, len, why, 1);
}

/* Streaming: extends the running checksum up to byte upto. */
static void snapshot_crc_to(kvidx_snapshot_reader_t *r, size_t upto)
{
    r->crc = kvidx_crc32c(r->crc, r->buf + r->crc_off, upto - r->crc_off);
    r->crc_off = upto;
}

static int snapshot_bad(kvidx_snapshot_reader_t *r, const char *why)
{
    r->why = why;
    return KVIDX_EINVAL;
}

int kvidx_snapshot_next(kvidx_snapshot_reader_t *r, kvidx_jrec_t *rec)
{
    static const char *malformed = "a record is malformed";
    if (r->why)
        return KVIDX_EINVAL; /* errors stick */
    for (;;) {
        const uint8_t *p;
        size_t n;
        if (r->streaming && r->off > r->crc_off && r->off - r->crc_off >= 65536)
            snapshot_crc_to(r, r->off);
        /* The file checksum (verified by kvidx_snapshot_open, or at the
         * end when streaming) covers every record: their own checksums
         * are not read again. */
        int rc = unframe(r->buf, r->end, r->off, &p, &n, 0);
        if (rc == 0) {
            if (r->nkeys != r->keys || r->nlayouts != r->layouts)
                return snapshot_bad(r, "the record counts do not match the trailer");
            if (r->streaming) {
                size_t sum_end = r->end + KVIDX_SNAPSHOT_TRAILER_LEN - 8;
                if (r->crc_off < sum_end) /* not yet: calls at the end repeat */
                    snapshot_crc_to(r, sum_end);
                if (r->crc != get32(r->buf + sum_end))
                    return snapshot_bad(r, "checksum mismatch: the file is damaged");
            }
            return 0;
        }
        if (rc < 0 || payload_decode(p, n, rec) != 0)
            return snapshot_bad(r, malformed);
        r->off += KVIDX_JREC_HDR_LEN + n;
        switch (rec->type) {
        case KVIDX_JREC_NS:
            r->has_ns = 1;
            r->model = rec->key.model;
            r->model_len = (uint8_t)rec->key.model_len;
            r->salt = rec->key.salt;
            r->salt_len = rec->key.salt_len;
            continue;
        case KVIDX_JREC_SKEY:
            if (!r->has_ns || r->nkeys == r->keys)
                return snapshot_bad(r, malformed);
            rec->type = KVIDX_JREC_KEY;
            rec->key.model = r->model;
            rec->key.model_len = r->model_len;
            rec->key.salt = r->salt;
            rec->key.salt_len = r->salt_len;
            r->nkeys++;
            return 1;
        case KVIDX_JREC_DIR:
            return 1;
        case KVIDX_JREC_LAYOUT_PUT:
            if (r->nlayouts == r->layouts)
                return snapshot_bad(r, malformed);
            r->nlayouts++;
            return 1;
        default:
            return snapshot_bad(r, malformed);
        }
    }
}
