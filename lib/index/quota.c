/*
 * Salt accounts and quotas (kvidx/index_quota.h).
 *
 * Every salt that has namespaces has one account: the namespaces of the
 * salt, which are contiguous in ns_sorted, all name it (ns->acct), and
 * every L1 copy of their keys names it too (l1m.acct, set when the copy is
 * made). The account counts the salt's L1 copies and bytes, and keeps its
 * own doubly linked list of the copies that are in the index's LRU
 * (newest .. oldest through sprev/snext). The list is pushed and unlinked
 * together with the LRU itself (lru_push, lru_unlink in index_int.h), so
 * its order is the LRU's order restricted to the salt, and evicting a
 * salt's least recent copy is O(1). The counters follow every L1 change
 * in O(1): l1_create and ix_l1_drop, the LRU functions, and acct_resize
 * where a key's size changes.
 *
 * Invariants (ix_check_accounts): account 0 is never used; a used account
 * has the interned salt of its namespaces and nns > 0 of them, a free one
 * is all zero but its free link and sits on the free list; its counters
 * are the sums over its salt's copies and its list holds exactly those in
 * the LRU, each linked back; its quota is the quota table's entry for its
 * salt (0 without one); the quota table is strictly sorted by salt, each
 * quota above 0. An account is freed with its salt's last namespace (no
 * copy can be left then); quotas outlive accounts, in the table.
 *
 * A store or a load checks each salt's room before changing anything
 * (ix_quota_run_*, ix_quota_room) and evicts the salt to its quota after
 * (ix_quota_evict), before the index-wide eviction to the L1 capacity.
 */
#include "index_int.h"

#include "kvidx/index_quota.h"

#include <stdlib.h>

#if defined(__GNUC__)
__attribute__((noinline, cold))
#endif
static int
acct_check_failed(void)
{
    return KVIDX_EINTERNAL;
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return acct_check_failed();                                                            \
    } while (0)

/* ---- the quota table ---- */

static int quota_cmp(const void *a, const void *b)
{
    const ix_quota_t *x = a, *y = b;
    return bytes_cmp(x->salt, x->len, y->salt, y->len);
}

/* 1 + the quota table's entry for a salt, 0 when it has none. */
static size_t quota_index(const kvidx_index_t *idx, const char *salt, size_t len)
{
    size_t lo = 0, hi = idx->acc.nquotas;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const ix_quota_t *q = &idx->acc.quotas[mid];
        int c = bytes_cmp(q->salt, q->len, salt, len);
        if (c == 0)
            return mid + 1;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* The quota of a salt, 0 when it has none. */
static uint64_t quota_lookup(const kvidx_index_t *idx, const char *salt, size_t len)
{
    size_t qi = quota_index(idx, salt, len);
    return qi ? idx->acc.quotas[qi - 1].bytes : 0;
}

/* Gives account a the quota of its salt. */
static void acct_take_quota(const kvidx_index_t *idx, ix_acct_t *a)
{
    size_t qi = quota_index(idx, a->salt->s, a->salt->len);
    a->qi = (uint32_t)qi;
    a->quota = qi ? idx->acc.quotas[qi - 1].bytes : 0;
}

/* The account of a salt, or 0 when the salt has no namespace. */
static uint32_t acct_find(const kvidx_index_t *idx, const char *salt, size_t len)
{
    size_t i = ns_lower_bound(idx, salt, len, "", 0);
    if (i < idx->n_ns &&
        bytes_cmp(idx->ns_sorted[i]->salt->s, idx->ns_sorted[i]->salt->len, salt, len) == 0)
        return idx->ns_sorted[i]->acct;
    return 0;
}

/* ---- accounts ---- */

int ix_acct_attach(kvidx_index_t *idx, ns_t *ns, size_t pos)
{
    ix_accounts_t *acc = &idx->acc;
    /* A salt's namespaces are contiguous: a sibling, if any, is next to
     * where ns goes. Interned salts compare by pointer. */
    const ns_t *sib = NULL;
    if (pos > 0 && idx->ns_sorted[pos - 1]->salt == ns->salt)
        sib = idx->ns_sorted[pos - 1];
    else if (pos < idx->n_ns && idx->ns_sorted[pos]->salt == ns->salt)
        sib = idx->ns_sorted[pos];
    if (sib) {
        ns->acct = sib->acct;
        acc->v[sib->acct].nns++;
        return 0;
    }
    uint32_t id;
    if (acc->nfree) {
        id = acc->free;
        acc->free = acc->v[id].next_free;
        acc->nfree--;
    } else {
        if (acc->n == acc->cap) {
            if (acc->cap >= UINT32_MAX / 4)
                return KVIDX_ECAPACITY;
            uint32_t cap = acc->cap ? acc->cap * 2 : 8;
            ix_acct_t *v = kvidx_realloc(acc->v, (size_t)cap * sizeof(*v));
            if (!v)
                return KVIDX_ENOMEM;
            if (!acc->v) {
                memset(&v[0], 0, sizeof(v[0]));
                acc->n = 1;
            }
            acc->v = v;
            acc->cap = cap;
        }
        id = acc->n++;
    }
    ix_acct_t *a = &acc->v[id];
    memset(a, 0, sizeof(*a));
    a->salt = ns->salt;
    a->nns = 1;
    acct_take_quota(idx, a);
    ns->acct = id;
    return 0;
}

void ix_acct_detach(kvidx_index_t *idx, ns_t *ns)
{
    ix_accounts_t *acc = &idx->acc;
    ix_acct_t *a = &acc->v[ns->acct];
    if (--a->nns)
        return;
    memset(a, 0, sizeof(*a));
    a->next_free = acc->free;
    acc->free = ns->acct;
    acc->nfree++;
}

void ix_accounts_free(kvidx_index_t *idx)
{
    kvidx_free(idx->acc.v);
    kvidx_free(idx->acc.quotas);
    memset(&idx->acc, 0, sizeof(idx->acc));
}

/* ---- room and eviction ---- */

int ix_quota_room(const kvidx_index_t *idx, uint32_t acct, uint64_t extra, uint64_t excluded)
{
    if (!acct || extra == 0)
        return 1;
    const ix_acct_t *a = &idx->acc.v[acct];
    if (!a->quota)
        return 1;
    uint64_t after = a->l1_bytes + extra;
    if (after <= a->quota)
        return 1;
    return after - a->quota <= a->lru_bytes - excluded;
}

void ix_quota_evict(kvidx_index_t *idx, uint32_t acct)
{
    if (!acct)
        return;
    /* The array does not move while evicting (nothing is allocated); an
     * account freed by its last key's eviction reads as all zero. */
    ix_acct_t *a = &idx->acc.v[acct];
    while (a->quota && a->l1_bytes > a->quota && a->oldest) {
        a->evictions++;
        idx->acc.evictions++;
        ix_evict_copy(idx, a->oldest);
    }
}

void ix_quota_evict_all(kvidx_index_t *idx)
{
    if (!idx->acc.nquotas)
        return;
    for (uint32_t id = 1; id < idx->acc.n; id++)
        if (idx->acc.v[id].salt)
            ix_quota_evict(idx, id);
}

void ix_quota_add(kvidx_index_t *idx, ix_qcache_t *c, kvidx_tier_t tier, const kvidx_put_t *it,
                  kvidx_ref_t ref, uint32_t ns_id)
{
    ix_accounts_t *acc = &idx->acc;
    const kvidx_key_t *k = &it->key;
    size_t qi;
    if (ref != KVIDX_REF_NONE) {
        qi = acc->v[acct_of_ref(idx, ref)].qi;
    } else if (ns_id != UINT32_MAX) {
        qi = acc->v[idx->ns_ids[ns_id].ns->acct].qi;
    } else {
        if (!c->valid || bytes_cmp(c->salt, c->salt_len, k->salt, k->salt_len) != 0) {
            c->valid = 1;
            c->salt = k->salt;
            c->salt_len = k->salt_len;
            c->qi = quota_index(idx, k->salt, k->salt_len);
        }
        qi = c->qi;
    }
    if (!qi)
        return;
    ix_quota_t *q = &acc->quotas[qi - 1];
    if (!q->pend_on) {
        q->pend_on = 1;
        q->pend_next = acc->pend_head;
        acc->pend_head = qi;
    }
    /* The same rules as the batch's own L1 count (store.c, put_count). */
    int64_t sz = (int64_t)it->size_bytes;
    if (ref == KVIDX_REF_NONE) {
        if (tier == KVIDX_TIER_L1)
            q->pend_d1 += sz;
        return;
    }
    const uint8_t *r = rec_at(idx, ref);
    int64_t old = (int64_t)rec_size(r);
    uint32_t m = rec_l1(r);
    if (m && idx->l1[m].in_lru)
        q->pend_excl += (uint64_t)old;
    if (tier == KVIDX_TIER_L1)
        q->pend_d1 += m ? sz - old : sz;
    else if (m)
        q->pend_d1 += sz - old;
}

int ix_quota_check_pending(const kvidx_index_t *idx)
{
    const ix_accounts_t *acc = &idx->acc;
    for (size_t qi = acc->pend_head; qi; qi = acc->quotas[qi - 1].pend_next) {
        const ix_quota_t *q = &acc->quotas[qi - 1];
        if (q->pend_d1 <= 0)
            continue;
        uint32_t id = acct_find(idx, q->salt, q->len);
        uint64_t l1 = id ? acc->v[id].l1_bytes : 0, lru = id ? acc->v[id].lru_bytes : 0;
        uint64_t after = l1 + (uint64_t)q->pend_d1;
        if (after > q->bytes && after - q->bytes > lru - q->pend_excl)
            return KVIDX_EQUOTA;
    }
    return 0;
}

void ix_quota_end_pending(kvidx_index_t *idx, int evict)
{
    ix_accounts_t *acc = &idx->acc;
    size_t qi = acc->pend_head;
    acc->pend_head = 0;
    while (qi) {
        ix_quota_t *q = &acc->quotas[qi - 1];
        qi = q->pend_next;
        q->pend_on = 0;
        q->pend_next = 0;
        q->pend_d1 = 0;
        q->pend_excl = 0;
        if (evict)
            ix_quota_evict(idx, acct_find(idx, q->salt, q->len));
    }
}

/* ---- public ---- */

int kvidx_index_set_quotas(kvidx_index_t *idx, const kvidx_salt_quota_t *q, size_t n)
{
    if (n > 0 && !q)
        return KVIDX_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (q[i].salt_len > KVIDX_SALT_MAX || (q[i].salt_len && !q[i].salt) ||
            q[i].quota_bytes == 0)
            return KVIDX_EINVAL;
    ix_quota_t *t = NULL;
    if (n) {
        t = kvidx_malloc(n * sizeof(*t));
        if (!t)
            return KVIDX_ENOMEM;
        memset(t, 0, n * sizeof(*t));
        for (size_t i = 0; i < n; i++) {
            t[i].bytes = q[i].quota_bytes;
            t[i].len = (uint8_t)q[i].salt_len;
            if (q[i].salt_len)
                memcpy(t[i].salt, q[i].salt, q[i].salt_len);
        }
        qsort(t, n, sizeof(*t), quota_cmp);
        for (size_t i = 1; i < n; i++) {
            if (quota_cmp(&t[i - 1], &t[i]) == 0) {
                kvidx_free(t);
                return KVIDX_EINVAL;
            }
        }
    }
    kvidx_free(idx->acc.quotas);
    idx->acc.quotas = t;
    idx->acc.nquotas = n;
    for (uint32_t id = 1; id < idx->acc.n; id++) {
        ix_acct_t *a = &idx->acc.v[id];
        if (a->salt)
            acct_take_quota(idx, a);
    }
    ix_quota_evict_all(idx);
    return 0;
}

/* The usage of account acct, whose namespaces start at ns_sorted[i]. */
static void usage_of(const kvidx_index_t *idx, uint32_t acct, size_t i, kvidx_salt_usage_t *out)
{
    const ix_acct_t *a = &idx->acc.v[acct];
    memset(out, 0, sizeof(*out));
    out->salt = a->salt->s;
    out->salt_len = a->salt->len;
    for (; i < idx->n_ns && idx->ns_sorted[i]->salt == a->salt; i++)
        out->keys += idx->ns_sorted[i]->nkeys;
    out->l1_keys = a->l1_keys;
    out->l1_bytes = a->l1_bytes;
    out->l1_evictable_bytes = a->lru_bytes;
    out->quota_bytes = a->quota;
    out->quota_evictions = a->evictions;
}

void kvidx_index_salt_usage(const kvidx_index_t *idx, const char *salt, size_t salt_len,
                            kvidx_salt_usage_t *out)
{
    size_t i = ns_lower_bound(idx, salt, salt_len, "", 0);
    if (i < idx->n_ns &&
        bytes_cmp(idx->ns_sorted[i]->salt->s, idx->ns_sorted[i]->salt->len, salt, salt_len) == 0) {
        usage_of(idx, idx->ns_sorted[i]->acct, i, out);
        return;
    }
    memset(out, 0, sizeof(*out));
    out->salt = salt;
    out->salt_len = salt_len;
    out->quota_bytes = quota_lookup(idx, salt, salt_len);
}

void kvidx_index_each_salt(const kvidx_index_t *idx,
                           void (*fn)(void *ctx, const kvidx_salt_usage_t *u), void *ctx)
{
    for (size_t i = 0; i < idx->n_ns; i++) {
        if (i > 0 && idx->ns_sorted[i - 1]->salt == idx->ns_sorted[i]->salt)
            continue;
        kvidx_salt_usage_t u;
        usage_of(idx, idx->ns_sorted[i]->acct, i, &u);
        fn(ctx, &u);
    }
}

uint64_t kvidx_index_quota_evictions(const kvidx_index_t *idx)
{
    return idx->acc.evictions;
}

/* ---- consistency ---- */

/* The free list: exactly nfree free slots, ending at 0 after the last
 * (which also rules out a repeated slot: a repeat would cycle, never
 * reaching 0). */
static int check_free_accounts(const ix_accounts_t *acc, uint32_t *used)
{
    if (acc->n == 0) {
        CHECK(acc->cap == 0 && acc->nfree == 0 && acc->free == 0);
        *used = 0;
        return 0;
    }
    CHECK(acc->n <= acc->cap && acc->v[0].salt == NULL && acc->nfree < acc->n);
    uint32_t id = acc->free;
    for (uint32_t k = 0; k < acc->nfree; k++) {
        CHECK(id >= 1 && id < acc->n);
        const ix_acct_t *a = &acc->v[id];
        CHECK(!a->salt && !a->nns && !a->l1_keys && !a->l1_bytes && !a->lru_bytes && !a->newest &&
              !a->oldest && !a->qi && !a->quota && !a->evictions);
        id = a->next_free;
    }
    CHECK(id == 0);
    uint32_t n = 0;
    for (id = 1; id < acc->n; id++)
        n += acc->v[id].salt != NULL;
    CHECK(n + acc->nfree + 1 == acc->n);
    *used = n;
    return 0;
}

/* The account of the salt whose namespaces are ns_sorted[i .. *end): every
 * one names it and it counts them; its counters are the sums over their
 * keys' L1 copies, and its list runs through exactly those in the LRU. */
static int check_salt(const kvidx_index_t *idx, size_t i, size_t *end)
{
    const ix_accounts_t *acc = &idx->acc;
    const ns_t *first = idx->ns_sorted[i];
    uint32_t id = first->acct;
    CHECK(id >= 1 && id < acc->n);
    const ix_acct_t *a = &acc->v[id];
    CHECK(a->salt == first->salt);
    uint64_t nns = 0, keys = 0, bytes = 0, lru_n = 0, lru_bytes = 0;
    size_t j = i;
    for (; j < idx->n_ns && idx->ns_sorted[j]->salt == first->salt; j++) {
        const ns_t *ns = idx->ns_sorted[j];
        CHECK(ns->acct == id);
        nns++;
        for (const leaf_t *l = ns->first; l; l = l->next) {
            for (uint32_t k = 0; k < l->n; k++) {
                const uint8_t *r = rec_at(idx, l->refs[k]);
                uint32_t m = rec_l1(r);
                if (!m)
                    continue;
                const l1m_t *e = &idx->l1[m];
                CHECK(e->acct == id);
                keys++;
                bytes += rec_size(r);
                lru_n += e->in_lru;
                lru_bytes += e->in_lru ? rec_size(r) : 0;
            }
        }
    }
    CHECK(a->nns == nns && a->l1_keys == keys && a->l1_bytes == bytes);
    CHECK(a->lru_bytes == lru_bytes);
    size_t qi = quota_index(idx, a->salt->s, a->salt->len);
    CHECK(a->qi == qi && a->quota == (qi ? acc->quotas[qi - 1].bytes : 0));
    CHECK(a->evictions <= acc->evictions);
    uint32_t prev = 0;
    uint64_t n = 0, ring_bytes = 0;
    for (uint32_t m = a->newest; m != 0; m = idx->l1[m].snext, n++) {
        CHECK(n < lru_n && m < idx->l1_used);
        const l1m_t *e = &idx->l1[m];
        CHECK(e->in_lru && e->acct == id && e->sprev == prev);
        ring_bytes += rec_size(rec_at(idx, e->ref));
        prev = m;
    }
    CHECK(a->oldest == prev && n == lru_n && ring_bytes == lru_bytes);
    *end = j;
    return 0;
}

int ix_check_accounts(const kvidx_index_t *idx)
{
    const ix_accounts_t *acc = &idx->acc;
    uint32_t used = 0;
    int rc = check_free_accounts(acc, &used);
    if (rc)
        return rc;
    uint32_t salts = 0;
    for (size_t i = 0; i < idx->n_ns; salts++) {
        rc = check_salt(idx, i, &i);
        if (rc)
            return rc;
    }
    /* One account per salt: each names its salt, so no two salts share
     * one, and there is no account without a salt. */
    CHECK(salts == used);
    /* Outside a store nothing is pending. */
    CHECK(acc->nquotas == 0 || acc->quotas);
    CHECK(acc->pend_head == 0);
    for (size_t i = 0; i < acc->nquotas; i++) {
        const ix_quota_t *q = &acc->quotas[i];
        CHECK(q->bytes > 0 && q->len <= KVIDX_SALT_MAX);
        CHECK(!q->pend_on && !q->pend_next && !q->pend_d1 && !q->pend_excl);
        CHECK(i == 0 || quota_cmp(&acc->quotas[i - 1], q) < 0);
    }
    return 0;
}
