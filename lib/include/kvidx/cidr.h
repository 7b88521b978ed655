/*
 * Lists of networks in CIDR notation ("10.0.0.0/8 192.168.1.7 fd00::/8"),
 * and whether an address falls in one of them. A bare address is a
 * network of one (/32, /128). An IPv4 network also matches the same
 * address written IPv4-mapped in IPv6 (::ffff:a.b.c.d), as a dual-stack
 * listener sees IPv4 clients.
 */
#ifndef KVIDX_CIDR_H
#define KVIDX_CIDR_H

#include <stddef.h>
#include <stdint.h>

#define KVIDX_CIDR_MAX 64 /* networks in one list */

typedef struct kvidx_cidr {
    uint8_t family; /* 4 or 6 */
    uint8_t bits;   /* prefix length */
    uint8_t addr[16];
} kvidx_cidr_t;

typedef struct kvidx_cidr_list {
    kvidx_cidr_t nets[KVIDX_CIDR_MAX];
    size_t n;
} kvidx_cidr_list_t;

/* Parses networks separated by blanks or commas (n bytes; "" is an empty
 * list). 0, or KVIDX_EINVAL with the 1-based position of the bad network
 * in *bad (more than KVIDX_CIDR_MAX networks is an error too). Host bits
 * set below the prefix are an error ("10.0.0.1/8"): they usually mean a
 * typo. */
int kvidx_cidr_parse(const char *s, size_t n, kvidx_cidr_list_t *out, size_t *bad);

/* 1 when the address (4 bytes for family 4, 16 for family 6) is in one of
 * the list's networks, else 0. */
int kvidx_cidr_match(const kvidx_cidr_list_t *l, int family, const uint8_t *addr);

#endif
