/*
 * Little-endian word loads for lib's word-at-a-time scanners (SipHash,
 * the hex decoder): one load on x86, a byte swap on big-endian hosts.
 * Private to lib/.
 */
#ifndef KVIDX_BYTES_INT_H
#define KVIDX_BYTES_INT_H

#include <stdint.h>
#include <string.h>

/* The 8 bytes at p as a word whose lowest byte is p[0]. */
static inline uint64_t kvidx_le64(const void *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

#endif
