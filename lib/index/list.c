/*
 * Ordered listing with a resumable cursor (kvidx_index_list).
 *
 * The listing order is namespaces in (salt, model) order, each tree in
 * key order, which is kvidx_key_cmp's total order; a listing resumes
 * strictly after a key value, never a position, so that a key present
 * throughout a paginated listing is returned exactly once whatever changes
 * between pages. A salt filter is a range of namespaces, a model filter
 * passes over whole namespaces (each one counting against the scan budget
 * without its keys being examined), a rank filter is a range inside each
 * tree and a group filter seeks from rank to rank. At most max_scan keys
 * and skipped namespaces are examined per call. Listing changes nothing.
 */
#include "index_int.h"

/* One listing call in progress. */
typedef struct lister {
    const kvidx_list_filter_t *f;
    const kvidx_key_t *after;
    kvidx_tier_t tier;
    size_t page_size, max_scan;
    kvidx_ref_t *refs;
    size_t n_out, seen;
    kvidx_ref_t last_seen, last_out;
    const ns_t *last_skipped; /* set when a skipped namespace was examined last */
    int stop, full_and_more;
} lister_t;

static int ns_salt_is(const ns_t *ns, const kvidx_list_filter_t *f)
{
    return bytes_cmp(ns->salt->s, ns->salt->len, f->salt, f->salt_len);
}

/* Whether ns is the namespace that the page resumes in. */
static int is_after_ns(const lister_t *l, const ns_t *ns)
{
    const kvidx_key_t *a = l->after;
    return a && ns_cmp(ns, a->salt, a->salt_len, a->model, a->model_len) == 0;
}

/* The first namespace the listing can take keys from. */
static size_t list_first_ns(const kvidx_index_t *idx, const lister_t *l)
{
    size_t s = 0;
    if (l->after)
        s = ns_lower_bound(idx, l->after->salt, l->after->salt_len, l->after->model,
                           l->after->model_len);
    if (l->f->has_salt) {
        size_t s2 = ns_lower_bound(idx, l->f->salt, l->f->salt_len, "", 0);
        if (s2 > s)
            s = s2;
    }
    return s;
}

/* A namespace the model filter excludes: it counts against the budget
 * (so that a page stays bounded however many salts there are) unless it
 * is the one the page resumes in, examined before. */
static void list_skip_ns(lister_t *l, const ns_t *ns)
{
    if (is_after_ns(l, ns))
        return;
    if (l->seen == l->max_scan) {
        l->stop = 1;
        return;
    }
    l->seen++;
    l->last_skipped = ns;
}

/* Positions c at the first key of ns the listing may return: after the
 * resume key in its namespace, and not before the rank (and group)
 * filter. */
static void list_seek_start(const kvidx_index_t *idx, const lister_t *l, const ns_t *ns,
                            cursor_t *c)
{
    const kvidx_list_filter_t *f = l->f;
    tkey_t lo = {0, 0, 0, NULL};
    int strict = 0;
    if (is_after_ns(l, ns)) {
        lo.rank = l->after->kv_rank;
        lo.group = l->after->group;
        lo.hash_len = l->after->hash_len;
        lo.hash = l->after->hash;
        strict = 1;
    }
    if (f->has_rank) {
        tkey_t fl = {f->kv_rank, f->has_group ? f->group : 0, 0, NULL};
        if (tk_cmp(&lo, &fl) < 0) {
            lo = fl;
            strict = 0;
        }
    }
    ix_tree_seek(idx, ns, &lo, strict, c);
}

/* Whether the listing's tier filter takes record r. A loading copy is
 * reserved, not readable: it does not make a key listable as an L1 key. */
static int tier_matches(const kvidx_index_t *idx, kvidx_tier_t tier, const uint8_t *r)
{
    uint32_t l1m = rec_l1(r);
    int l1_ready = l1m && idx->l1[l1m].state == KVIDX_L1_READY;
    return !((tier == KVIDX_TIER_L1 && !l1_ready) || (tier == KVIDX_TIER_L2 && !rec_l2_any(r)) ||
             (tier == KVIDX_TIER_ALL && !l1_ready && !rec_l2_any(r)));
}

/* Examines the keys of ns from the filters' start, until the page is full
 * and one more match is seen, the budget runs out (l->stop) or the
 * filters' range in ns ends. The loop works on local copies of the
 * counters (kept in registers) and stores them back at the end. */
static void list_scan_ns(const kvidx_index_t *idx, lister_t *l, const ns_t *ns)
{
    const kvidx_list_filter_t *f = l->f;
    size_t seen = l->seen, n_out = l->n_out;
    kvidx_ref_t last_seen = l->last_seen, last_out = l->last_out;
    cursor_t c;
    list_seek_start(idx, l, ns, &c);
    while (c.leaf) {
        if (seen == l->max_scan) {
            l->stop = 1;
            break;
        }
        kvidx_ref_t ref = c.leaf->refs[c.pos];
        const uint8_t *r = rec_at(idx, ref);
        seen++;
        last_seen = ref;
        if (++c.pos == c.leaf->n) {
            c.leaf = c.leaf->next;
            c.pos = 0;
        }
        uint32_t rank = rec_rank(r);
        uint16_t group = rec_group(r);
        if (f->has_rank && rank != f->kv_rank)
            break; /* past the rank's range in this namespace */
        if (f->has_group && group != f->group) {
            if (f->has_rank && group > f->group)
                break;
            /* Seek to the group within this rank or the next rank. */
            tkey_t t = {rank, f->group, 0, NULL};
            if (group > f->group) {
                if (rank == UINT32_MAX)
                    break;
                t.rank = rank + 1;
            }
            ix_tree_seek(idx, ns, &t, 0, &c);
            continue;
        }
        if (!tier_matches(idx, l->tier, r))
            continue;
        if (n_out == l->page_size) {
            l->full_and_more = 1;
            l->stop = 1;
            break;
        }
        l->refs[n_out++] = ref;
        last_out = ref;
    }
    if (seen != l->seen)
        l->last_skipped = NULL; /* a key was examined after it */
    l->seen = seen;
    l->n_out = n_out;
    l->last_seen = last_seen;
    l->last_out = last_out;
}

/* Sets *resume and *more after a listing stopped before the end. */
static void list_resume(const kvidx_index_t *idx, const lister_t *l, kvidx_key_buf_t *resume,
                        int *more)
{
    kvidx_key_t k;
    if (!l->full_and_more && l->last_skipped) {
        /* The budget ran out among skipped namespaces: resume after the
         * largest key the last one could hold (it holds no match). */
        memset(&k, 0, sizeof(k));
        k.salt = l->last_skipped->salt->s;
        k.salt_len = (uint8_t)l->last_skipped->salt->len;
        k.model = l->last_skipped->model->s;
        k.model_len = (uint16_t)l->last_skipped->model->len;
        k.kv_rank = UINT32_MAX;
        k.group = UINT16_MAX;
        k.hash_len = KVIDX_HASH_MAX;
        memset(k.hash, 0xff, sizeof(k.hash));
    } else {
        /* max_scan >= 1, so a key or a namespace was examined before the
         * budget ran out: last_seen is set when last_skipped is not. */
        make_key(idx, rec_at(idx, l->full_and_more ? l->last_out : l->last_seen), &k);
    }
    kvidx_key_buf_set(resume, &k);
    *more = 1;
}

int kvidx_index_list(const kvidx_index_t *idx, const kvidx_list_filter_t *f,
                     const kvidx_key_t *after, size_t page_size, size_t max_scan, kvidx_ref_t *refs,
                     size_t *count, kvidx_key_buf_t *resume, int *more, size_t *examined)
{
    *count = 0;
    *more = 0;
    if (examined)
        *examined = 0;
    if (!page_size || !max_scan)
        return KVIDX_EINVAL;
    kvidx_list_filter_t none = {0};
    if (!f)
        f = &none;
    lister_t l = {
        .f = f,
        .after = after,
        .tier = f->tier ? f->tier : KVIDX_TIER_ALL,
        .page_size = page_size,
        .max_scan = max_scan,
        .refs = refs,
        .last_seen = KVIDX_REF_NONE,
        .last_out = KVIDX_REF_NONE,
    };
    for (size_t s = list_first_ns(idx, &l); s < idx->n_ns && !l.stop; s++) {
        const ns_t *ns = idx->ns_sorted[s];
        if (f->has_salt && ns_salt_is(ns, f) != 0)
            break; /* past the salt's range */
        if (f->has_model && bytes_cmp(ns->model->s, ns->model->len, f->model, f->model_len) != 0)
            list_skip_ns(&l, ns);
        else
            list_scan_ns(idx, &l, ns);
    }
    *count = l.n_out;
    if (examined)
        *examined = l.seen;
    if (l.stop)
        list_resume(idx, &l, resume, more);
    return 0;
}

int kvidx_index_list_entry(const kvidx_index_t *idx, kvidx_ref_t ref, kvidx_list_entry_t *e)
{
    if (!ref_live(idx, ref))
        return KVIDX_ENOTFOUND;
    const uint8_t *r = rec_at(idx, ref);
    const ns_t *ns = idx->ns_ids[rec_ns(r)].ns;
    e->model = ns->model->s;
    e->model_len = ns->model->len;
    e->salt = ns->salt->s;
    e->salt_len = (uint8_t)ns->salt->len;
    e->hash_len = rec_hl(r);
    e->group = rec_group(r);
    e->kv_rank = rec_rank(r);
    e->ns_id = rec_ns(r);
    e->hash = rec_hash(r);
    e->size_bytes = rec_size(r);
    return 0;
}
