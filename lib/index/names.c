/*
 * Interned names and namespaces.
 *
 * Model names and salts are interned once, in an array sorted by bytes
 * with no two equal entries; an interned string's refcount is the number
 * of namespaces that use it as their salt plus those that use it as their
 * model, and a string whose count drops to 0 is freed. A namespace is one
 * interned (cache_salt, model_name) pair with its own B+tree; namespaces
 * sit in ns_sorted strictly ordered by (salt, model), so a salt filter is
 * a range of that array, and each has a small id (its slot in ns_ids, free
 * ids threaded through next_free) that records store instead of a
 * pointer. A namespace exists exactly while it has keys: one created for
 * a store that then fails is dropped again (ix_ns_drop_if_empty). Each
 * namespace names the account of its salt (quota.c), made with the salt's
 * first namespace and freed with its last. The
 * binary search over namespaces is inlined in index_int.h.
 */
#include "index_int.h"

size_t ix_str_lower_bound(const kvidx_index_t *idx, const char *s, size_t n)
{
    size_t lo = 0, hi = idx->nstrs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (bytes_cmp(idx->strs[mid]->s, idx->strs[mid]->len, s, n) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Interns s (taking one reference) or fails with KVIDX_ENOMEM. */
static int str_get(kvidx_index_t *idx, const char *s, size_t n, istr_t **out)
{
    size_t i = ix_str_lower_bound(idx, s, n);
    if (i < idx->nstrs && bytes_cmp(idx->strs[i]->s, idx->strs[i]->len, s, n) == 0) {
        idx->strs[i]->refs++;
        *out = idx->strs[i];
        return 0;
    }
    if (idx->nstrs == idx->strs_cap) {
        size_t cap = idx->strs_cap ? idx->strs_cap * 2 : 8;
        istr_t **a = kvidx_realloc(idx->strs, cap * sizeof(*a));
        if (!a)
            return KVIDX_ENOMEM;
        idx->strs = a;
        idx->strs_cap = cap;
    }
    istr_t *str = kvidx_malloc(sizeof(*str) + n + 1);
    if (!str)
        return KVIDX_ENOMEM;
    str->refs = 1;
    str->len = (uint16_t)n;
    if (n)
        memcpy(str->s, s, n);
    str->s[n] = '\0';
    memmove(idx->strs + i + 1, idx->strs + i, (idx->nstrs - i) * sizeof(*idx->strs));
    idx->strs[i] = str;
    idx->nstrs++;
    *out = str;
    return 0;
}

static void str_put(kvidx_index_t *idx, istr_t *str)
{
    if (--str->refs)
        return;
    size_t i = ix_str_lower_bound(idx, str->s, str->len);
    memmove(idx->strs + i, idx->strs + i + 1, (idx->nstrs - i - 1) * sizeof(*idx->strs));
    idx->nstrs--;
    kvidx_free(str);
}

/* Makes sure a namespace can be added to ns_sorted and given an id. */
static int ns_make_room(kvidx_index_t *idx)
{
    if (idx->n_ns == idx->ns_sorted_cap) {
        size_t cap = idx->ns_sorted_cap ? idx->ns_sorted_cap * 2 : 8;
        ns_t **a = kvidx_realloc(idx->ns_sorted, cap * sizeof(*a));
        if (!a)
            return KVIDX_ENOMEM;
        idx->ns_sorted = a;
        idx->ns_sorted_cap = cap;
    }
    if (idx->ns_free == UINT32_MAX && idx->ns_ids_n == idx->ns_ids_cap) {
        if (idx->ns_ids_cap >= UINT32_MAX / 4)
            return KVIDX_ECAPACITY;
        uint32_t cap = idx->ns_ids_cap ? idx->ns_ids_cap * 2 : 8;
        ns_slot_t *a = kvidx_realloc(idx->ns_ids, (size_t)cap * sizeof(*a));
        if (!a)
            return KVIDX_ENOMEM;
        idx->ns_ids = a;
        idx->ns_ids_cap = cap;
    }
    return 0;
}

/* Finds or creates the namespace of k. A namespace created here has no
 * keys; ix_ns_drop_if_empty undoes it. */
int ix_ns_get(kvidx_index_t *idx, const kvidx_key_t *k, ns_t **out)
{
    size_t i = ns_lower_bound(idx, k->salt, k->salt_len, k->model, k->model_len);
    if (i < idx->n_ns &&
        ns_cmp(idx->ns_sorted[i], k->salt, k->salt_len, k->model, k->model_len) == 0) {
        *out = idx->ns_sorted[i];
        return 0;
    }
    int rc = ns_make_room(idx);
    if (rc)
        return rc;
    ns_t *ns = kvidx_calloc(1, sizeof(*ns));
    if (!ns)
        return KVIDX_ENOMEM;
    rc = str_get(idx, k->salt, k->salt_len, &ns->salt);
    if (rc) {
        kvidx_free(ns);
        return rc;
    }
    rc = str_get(idx, k->model, k->model_len, &ns->model);
    if (rc == 0)
        rc = ix_acct_attach(idx, ns, i);
    if (rc) {
        if (ns->model)
            str_put(idx, ns->model);
        str_put(idx, ns->salt);
        kvidx_free(ns);
        return rc;
    }
    uint32_t id;
    if (idx->ns_free != UINT32_MAX) {
        id = idx->ns_free;
        idx->ns_free = idx->ns_ids[id].next_free;
    } else {
        id = idx->ns_ids_n++;
    }
    idx->ns_ids[id].ns = ns;
    ns->id = id;
    memmove(idx->ns_sorted + i + 1, idx->ns_sorted + i, (idx->n_ns - i) * sizeof(ns_t *));
    idx->ns_sorted[i] = ns;
    idx->n_ns++;
    *out = ns;
    return 0;
}

void ix_ns_drop_if_empty(kvidx_index_t *idx, ns_t *ns)
{
    if (ns->nkeys)
        return;
    size_t i = ns_lower_bound(idx, ns->salt->s, ns->salt->len, ns->model->s, ns->model->len);
    memmove(idx->ns_sorted + i, idx->ns_sorted + i + 1, (idx->n_ns - i - 1) * sizeof(ns_t *));
    idx->n_ns--;
    idx->ns_ids[ns->id].ns = NULL;
    idx->ns_ids[ns->id].next_free = idx->ns_free;
    idx->ns_free = ns->id;
    ix_acct_detach(idx, ns);
    str_put(idx, ns->salt);
    str_put(idx, ns->model);
    kvidx_free(ns);
}
