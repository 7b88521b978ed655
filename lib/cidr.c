/*
 * CIDR lists: parsing and matching (kvidx/cidr.h). Addresses are parsed by
 * hand (no inet_pton: lib/ calls nothing of the system's network code), in
 * the strict forms: dotted quads of decimal octets without leading zeros,
 * and RFC 4291 IPv6 text with at most one "::" and an optional trailing
 * dotted quad.
 *
 * Invariants: every network in a list has its host bits zero, so matching
 * is a compare of the first `bits` bits.
 */
#include "kvidx/cidr.h"

#include "kvidx/err.h"

#include <string.h>

static int parse_v4(const char *s, size_t n, uint8_t out[4])
{
    size_t i = 0;
    for (int part = 0; part < 4; part++) {
        if (part > 0) {
            if (i >= n || s[i] != '.')
                return KVIDX_EINVAL;
            i++;
        }
        size_t start = i;
        unsigned v = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9' && i - start < 3)
            v = v * 10 + (unsigned)(s[i++] - '0');
        if (i == start || v > 255 || (i - start > 1 && s[start] == '0'))
            return KVIDX_EINVAL;
        out[part] = (uint8_t)v;
    }
    return i == n ? 0 : KVIDX_EINVAL;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The 16-bit groups of one side of "::" (or of the whole address): up to
 * max groups into g, *count of them; a trailing dotted quad counts two. */
static int parse_groups(const char *s, size_t n, uint16_t *g, size_t max, size_t *count)
{
    size_t k = 0, i = 0;
    while (i < n) {
        size_t start = i;
        unsigned v = 0;
        while (i < n && hexval(s[i]) >= 0 && i - start < 4)
            v = v * 16 + (unsigned)hexval(s[i++]);
        if (i < n && s[i] == '.') {
            uint8_t q[4];
            if (k + 2 > max || parse_v4(s + start, n - start, q) != 0)
                return KVIDX_EINVAL;
            g[k++] = (uint16_t)(q[0] << 8 | q[1]);
            g[k++] = (uint16_t)(q[2] << 8 | q[3]);
            *count = k;
            return 0;
        }
        if (i == start || k == max)
            return KVIDX_EINVAL;
        g[k++] = (uint16_t)v;
        if (i < n) {
            if (s[i] != ':' || i + 1 == n)
                return KVIDX_EINVAL;
            i++;
        }
    }
    *count = k;
    return 0;
}

static int parse_v6(const char *s, size_t n, uint8_t out[16])
{
    uint16_t head[8], tail[8];
    size_t nh = 0, nt = 0;
    const char *dc = NULL;
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] == ':' && s[i + 1] == ':') {
            dc = s + i;
            break;
        }
    }
    if (dc) {
        size_t hl = (size_t)(dc - s);
        const char *t = dc + 2;
        size_t tl = n - hl - 2;
        if (tl >= 1 && t[0] == ':')
            return KVIDX_EINVAL; /* ":::" */
        for (size_t i = 0; i + 1 < tl; i++)
            if (t[i] == ':' && t[i + 1] == ':')
                return KVIDX_EINVAL; /* a second "::" */
        if (parse_groups(s, hl, head, 8, &nh) != 0 || parse_groups(t, tl, tail, 8, &nt) != 0 ||
            nh + nt > 7)
            return KVIDX_EINVAL;
    } else if (parse_groups(s, n, head, 8, &nh) != 0 || nh != 8) {
        return KVIDX_EINVAL;
    }
    uint16_t g[8] = {0};
    memcpy(g, head, nh * sizeof(g[0]));
    memcpy(g + 8 - nt, tail, nt * sizeof(g[0]));
    for (int i = 0; i < 8; i++) {
        out[2 * i] = (uint8_t)(g[i] >> 8);
        out[2 * i + 1] = (uint8_t)g[i];
    }
    return 0;
}

static int host_bits_zero(const uint8_t *a, size_t len, unsigned bits)
{
    for (size_t i = 0; i < len; i++) {
        unsigned keep = bits >= 8 * (i + 1) ? 8 : bits > 8 * i ? bits - 8 * (unsigned)i : 0;
        uint8_t mask = keep == 8 ? 0xff : (uint8_t)(0xff << (8 - keep));
        if (a[i] & (uint8_t)~mask)
            return 0;
    }
    return 1;
}

static int parse_one(const char *s, size_t n, kvidx_cidr_t *out)
{
    memset(out, 0, sizeof(*out));
    const char *slash = memchr(s, '/', n);
    size_t alen = slash ? (size_t)(slash - s) : n;
    int v6 = memchr(s, ':', alen) != NULL;
    out->family = v6 ? 6 : 4;
    unsigned max = v6 ? 128 : 32;
    if ((v6 ? parse_v6(s, alen, out->addr) : parse_v4(s, alen, out->addr)) != 0)
        return KVIDX_EINVAL;
    unsigned bits = max;
    if (slash) {
        const char *p = slash + 1, *e = s + n;
        if (p == e || e - p > 3 || (e - p > 1 && *p == '0'))
            return KVIDX_EINVAL;
        bits = 0;
        for (; p < e; p++) {
            if (*p < '0' || *p > '9')
                return KVIDX_EINVAL;
            bits = bits * 10 + (unsigned)(*p - '0');
        }
        if (bits > max)
            return KVIDX_EINVAL;
    }
    out->bits = (uint8_t)bits;
    return host_bits_zero(out->addr, v6 ? 16 : 4, bits) ? 0 : KVIDX_EINVAL;
}

int kvidx_cidr_parse(const char *s, size_t n, kvidx_cidr_list_t *out, size_t *bad)
{
    out->n = 0;
    *bad = 0;
    size_t i = 0, pos = 0;
    while (i < n) {
        while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == ','))
            i++;
        size_t start = i;
        while (i < n && s[i] != ' ' && s[i] != '\t' && s[i] != ',')
            i++;
        if (i == start)
            break;
        pos++;
        if (out->n == KVIDX_CIDR_MAX || parse_one(s + start, i - start, &out->nets[out->n]) != 0) {
            *bad = pos;
            out->n = 0;
            return KVIDX_EINVAL;
        }
        out->n++;
    }
    return 0;
}

static int prefix_equal(const uint8_t *a, const uint8_t *b, unsigned bits)
{
    size_t whole = bits / 8;
    if (memcmp(a, b, whole) != 0)
        return 0;
    unsigned rest = bits % 8;
    if (!rest)
        return 1;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));
    return (a[whole] & mask) == (b[whole] & mask);
}

int kvidx_cidr_match(const kvidx_cidr_list_t *l, int family, const uint8_t *addr)
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    const uint8_t *v4 = family == 4 ? addr : NULL;
    if (family == 6 && memcmp(addr, mapped, sizeof(mapped)) == 0)
        v4 = addr + 12;
    for (size_t i = 0; i < l->n; i++) {
        const kvidx_cidr_t *c = &l->nets[i];
        if (c->family == 4 && v4 && prefix_equal(c->addr, v4, c->bits))
            return 1;
        if (c->family == 6 && family == 6 && prefix_equal(c->addr, addr, c->bits))
            return 1;
    }
    return 0;
}
