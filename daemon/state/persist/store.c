/*
 * The key store as persistence sees it: durable key states out (for the
 * snapshot) and in (replay, undo, snapshot restore), the change hook that
 * feeds the journal, and the key rules a restored key must pass, as a key
 * in a request must. Everything persistence does to the libkvidx index
 * goes through here.
 *
 * Invariant: a durable state is "size, a ready non-temporary L1 copy
 * yes/no, an L2 copy stored through the API yes/no" (KVIDX_DURABLE_*, the
 * journal's tier bits; a source's L2 copies are never durable);
 * loading and temporary L1 copies are never reported as durable, so a
 * state read out and applied back gives the same durable state.
 */
#include "state/persist/persist.h"
#include "state/persist/persist_int.h"

#include "kvidx/err.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(KVIDX_STATE_L1 == KVIDX_DURABLE_L1 && KVIDX_STATE_L2 == KVIDX_DURABLE_L2,
               "journal tier bits are the index's durable tier bits");

#define WALK_BATCH 4096

/* The durable state an entry's info describes: 0, or 1 when it has none.
 * Only an L2 copy stored through the API is durable; one held by a source
 * (l2_source) is not: a restart finds it again by scanning the store. */
static int durable_of(const kvidx_entry_info_t *info, kvidx_durable_t *st)
{
    st->tiers = info->l2_api ? KVIDX_DURABLE_L2 : 0;
    if (info->l1_state == KVIDX_L1_READY && !info->temporary)
        st->tiers |= KVIDX_DURABLE_L1;
    st->size_bytes = info->size_bytes;
    return st->tiers ? 0 : 1;
}

int store_each_state(kvidx_index_t *idx, store_state_fn fn, void *ctx)
{
    kvidx_ref_t *refs = malloc(WALK_BATCH * sizeof(*refs));
    kvidx_key_buf_t *resume = malloc(sizeof(*resume));
    int rc = 0;
    if (!refs || !resume) {
        rc = KVIDX_ENOMEM;
        goto out;
    }
    kvidx_list_filter_t f;
    memset(&f, 0, sizeof(f));
    f.tier = KVIDX_TIER_ALL;
    const kvidx_key_t *after = NULL;
    for (;;) {
        size_t count = 0;
        int more = 0;
        rc = kvidx_index_list(idx, &f, after, WALK_BATCH, 1u << 30, refs, &count, resume, &more,
                              NULL);
        if (rc != 0)
            goto out;
        for (size_t i = 0; i < count; i++) {
            kvidx_key_t key;
            kvidx_entry_info_t info;
            kvidx_durable_t st;
            if (kvidx_index_key(idx, refs[i], &key) != 0 ||
                kvidx_index_info(idx, refs[i], &info) != 0 || durable_of(&info, &st) != 0)
                continue;
            if ((rc = fn(ctx, &key, &st)) != 0)
                goto out;
        }
        if (!more)
            break;
        after = &resume->key;
    }
out:
    free(refs);
    free(resume);
    return rc;
}

int store_apply(kvidx_index_t *idx, const kvidx_key_t *key, const kvidx_durable_t *st, int force)
{
    kvidx_del_outcome_t o;
    if (!(st->tiers & KVIDX_DURABLE_L1))
        kvidx_index_delete(idx, key, KVIDX_TIER_L1, force, &o);
    if (!(st->tiers & KVIDX_DURABLE_L2))
        kvidx_index_delete(idx, key, KVIDX_TIER_L2, force, &o);
    kvidx_put_t it = {*key, st->size_bytes};
    int rc = 0;
    if (st->tiers & KVIDX_DURABLE_L2)
        rc = kvidx_index_put_batch(idx, KVIDX_TIER_L2, &it, 1, NULL);
    if (!rc && (st->tiers & KVIDX_DURABLE_L1))
        rc = kvidx_index_put_batch(idx, KVIDX_TIER_L1, &it, 1, NULL);
    return rc;
}

int store_reserve(kvidx_index_t *idx, uint64_t nkeys)
{
    return kvidx_index_reserve(idx, nkeys);
}

int store_load(kvidx_index_t *idx, const kvidx_load_t *items, size_t n)
{
    int rc = n ? kvidx_index_load(idx, items, n, NULL) : 0;
    if (rc == 0 || rc == KVIDX_ENOMEM)
        return rc;
    return KVIDX_EINVAL;
}

int store_held(kvidx_index_t *idx, const kvidx_key_t *key)
{
    kvidx_ref_t ref;
    kvidx_entry_info_t info;
    if (kvidx_index_find(idx, key, &ref) != 0 || kvidx_index_info(idx, ref, &info) != 0)
        return 0;
    return info.l1_state == KVIDX_L1_LOADING || info.pins > 0;
}

void store_watch(kvidx_index_t *idx, kvidx_change_cb cb, void *ctx)
{
    kvidx_index_set_change_cb(idx, cb, ctx);
}

/* Only the namespace can break the rules: kv_rank, group and hash have
 * none a decoded record can miss (the decoder checks the hash length). */
int store_key_check(struct key_rules *c, const kvidx_key_t *key, kvidx_reason_t *why)
{
    if (c->have && c->model_len == key->model_len && c->salt_len == key->salt_len &&
        memcmp(c->model, key->model, key->model_len) == 0 &&
        (!key->salt_len || memcmp(c->salt, key->salt, key->salt_len) == 0))
        return 0;
    int rc = kvidx_key_check_model(key->model, key->model_len, why);
    if (rc == 0)
        rc = kvidx_key_check_salt(key->salt, key->salt_len, why);
    if (rc != 0 || key->model_len > sizeof(c->model) || key->salt_len > sizeof(c->salt))
        return rc ? rc : KVIDX_EKEY;
    memcpy(c->model, key->model, key->model_len);
    if (key->salt_len)
        memcpy(c->salt, key->salt, key->salt_len);
    c->model_len = key->model_len;
    c->salt_len = key->salt_len;
    c->have = 1;
    return 0;
}

uint64_t store_count(kvidx_index_t *idx)
{
    kvidx_index_stats_t st;
    kvidx_index_stats(idx, &st);
    return st.keys;
}
