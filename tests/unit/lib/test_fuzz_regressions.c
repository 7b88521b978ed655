/*
 * Inputs the fuzz targets (tests/fuzz/) found, as plain calls, so that
 * every build's tests replay them (the sanitizer build turns the undefined
 * behaviour they once had into a failure).
 */
#include "kvidx/directory.h"
#include "kvidx/err.h"
#include "kvidx/fold.h"
#include "kvidx/key.h"

#include <criterion/criterion.h>
#include <string.h>

/* Scoring keys of which the directory holds none: no placement at all,
 * so no scratch was allocated, and the scorer must not compute offsets
 * into the missing buffer. The answer is empty. */
Test(fuzz_regressions, directory_score_of_unknown_keys)
{
    kvidx_directory_t *d;
    kvidx_dir_options_t o = {.has_seed = 1};
    cr_assert_eq(kvidx_directory_new(&o, &d), 0);
    kvidx_key_t k[2];
    memset(k, 0, sizeof(k));
    for (int i = 0; i < 2; i++) {
        k[i].model = "m";
        k[i].model_len = 1;
        k[i].salt = "";
        k[i].kv_rank = 16777472;
        k[i].hash_len = 1;
        k[i].hash[0] = (uint8_t)i;
    }
    int64_t full = KVIDX_WINDOW_FULL;
    kvidx_fold_shape_t shape = {.windows = &full, .num_groups = 1, .num_chunks = 2, .num_ranks = 1};
    kvidx_dir_score_t *scores = NULL;
    size_t n = 99;
    cr_assert_eq(kvidx_directory_score(d, k, 2, &shape, &scores, &n), 0);
    cr_assert_eq(n, 0);
    kvidx_directory_score_free(scores);
    kvidx_directory_free(d);
}
