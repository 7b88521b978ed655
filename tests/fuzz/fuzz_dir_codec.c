/*
 * libFuzzer target for the fleet directory's persistence bytes
 * (kvidx/directory_codec.h). The input is a sequence of blobs, each
 * prefixed by a 2-byte little-endian length; they are replayed in order
 * into an empty directory, as restore replays DIR records. Replaying must
 * never crash or read past a blob (each is copied to its own allocation),
 * the directory must pass kvidx_directory_check after every blob, and its
 * dump must re-encode.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvidx/directory.h"
#include "kvidx/directory_codec.h"
#include "kvidx/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

static int sink(void *ctx, const uint8_t *blob, size_t len)
{
    (void)ctx;
    check(len > 0 && blob != NULL);
    return 0;
}

static int reencode(void *ctx, const kvidx_dir_record_t *r)
{
    (void)ctx;
    int rc = kvidx_dir_record_encode(r, 1u << 20, sink, NULL);
    check(rc == 0 || rc == KVIDX_ENOMEM);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvidx_directory_t *d;
    kvidx_dir_options_t o = {.token_bytes_cap = 1u << 20, .has_seed = 1};
    if (kvidx_directory_new(&o, &d) != 0)
        return 0;
    kvidx_dir_replay_t rp;
    kvidx_dir_replay_init(&rp, 1000);
    size_t off = 0;
    while (size - off >= 2) {
        size_t n = (size_t)data[off] | (size_t)data[off + 1] << 8;
        off += 2;
        if (n > size - off)
            n = size - off;
        uint8_t *b = malloc(n ? n : 1);
        if (!b)
            break;
        memcpy(b, data + off, n);
        off += n;
        kvidx_dir_replay_blob(&rp, d, b, n);
        free(b);
        check(kvidx_directory_check(d) == 0);
    }
    kvidx_directory_dump(d, reencode, NULL);
    kvidx_dir_replay_free(&rp);
    kvidx_directory_free(d);
    return 0;
}
