/*
 * Reads of the fleet directory: rows and their placement walks, the
 * offset/limit listing, the resumable scan, lookups and the score.
 *
 * Reads allocate nothing except the score's result and scratch. A filter's
 * strings are resolved to sids once; a string the directory does not hold
 * matches nothing. The scan's exactly-once guarantee comes from resuming
 * strictly after the last key examined in canonical order: a key present
 * throughout is met when the walk passes its place, and never twice.
 */
#include "directory_int.h"

#include <stdlib.h>

void dr_filter_resolve(const kvidx_directory_t *d, const kvidx_dir_filter_t *f, rfilter_t *out)
{
    out->tier = f ? f->tier : KVIDX_DIR_ALL;
    out->inst = out->backend = NONE;
    if (f && f->instance_len) {
        uint32_t s = dr_str_find(d, f->instance_id, f->instance_len);
        out->inst = s == NONE ? NOMATCH : s;
    }
    if (f && f->backend_len) {
        uint32_t s = dr_str_find(d, f->backend, f->backend_len);
        out->backend = s == NONE ? NOMATCH : s;
    }
}

static int pl_matches(const kvidx_directory_t *d, uint32_t p, int tier, uint32_t inst,
                      uint32_t backend)
{
    const dsrc_t *s = S(d, P(d, p)->src);
    return (tier == KVIDX_DIR_ALL || s->tier == tier) && (inst == NONE || s->inst == inst) &&
           (backend == NONE || s->backend == backend);
}

static size_t count_matching(const kvidx_directory_t *d, uint32_t ref, const rfilter_t *f)
{
    size_t n = 0;
    for (uint32_t p = K(d, ref)->plist; !(p & KEY_TAG); p = P(d, p)->next)
        n += pl_matches(d, p, f->tier, f->inst, f->backend);
    return n;
}

static void row_tokens(const kvidx_directory_t *d, uint32_t bind, kvidx_dir_row_t *row)
{
    if (bind == NONE) {
        row->token_ids = NULL;
        row->num_tokens = 0;
        row->token_offset = KVIDX_DIR_UNKNOWN_OFFSET;
    } else {
        const dbind_t *b = d->binds[bind];
        row->token_ids = b->tok;
        row->num_tokens = b->ntok;
        row->token_offset = b->offset;
    }
}

void dr_row_fill(const kvidx_directory_t *d, uint32_t ref, const rfilter_t *f, kvidx_dir_row_t *row)
{
    const krec_t *r = K(d, ref);
    dr_key_view(d, ref, &row->key);
    row->last_access = r->last_access;
    row->num_placements = count_matching(d, ref, f);
    row_tokens(d, r->bind, row);
    row->d_ = d;
    row->next_ = r->plist;
    row->f_tier_ = f->tier;
    row->f_inst_ = f->inst;
    row->f_backend_ = f->backend;
}

void dr_placement_view(const kvidx_directory_t *d, uint32_t p, kvidx_dir_placement_t *out)
{
    const dsrc_t *s = S(d, P(d, p)->src);
    out->instance_id = d->strs[s->inst].s;
    out->instance_len = d->strs[s->inst].len;
    out->incarnation = s->incarnation;
    out->tier = s->tier;
    out->backend = d->strs[s->backend].s;
    out->backend_len = d->strs[s->backend].len;
    out->size_bytes = P(d, p)->size;
    out->shared = s->shared;
}

int kvidx_directory_row_next(kvidx_dir_row_t *row, kvidx_dir_placement_t *out)
{
    const kvidx_directory_t *d = row->d_;
    while (row->next_ != NONE && !(row->next_ & KEY_TAG)) {
        uint32_t p = row->next_;
        row->next_ = P(d, p)->next;
        if (pl_matches(d, p, row->f_tier_, row->f_inst_, row->f_backend_)) {
            dr_placement_view(d, p, out);
            return 1;
        }
    }
    return 0;
}

static int filter_empty(const rfilter_t *f)
{
    return f->inst == NOMATCH || f->backend == NOMATCH;
}

static int filter_all(const rfilter_t *f)
{
    return f->tier == KVIDX_DIR_ALL && f->inst == NONE && f->backend == NONE;
}

int kvidx_directory_list(const kvidx_directory_t *d, const kvidx_dir_filter_t *f, uint64_t offset,
                         uint64_t limit, int (*cb)(void *ctx, kvidx_dir_row_t *row), void *ctx,
                         uint64_t *total)
{
    rfilter_t rf;
    dr_filter_resolve(d, f, &rf);
    if (total)
        *total = 0;
    if (filter_empty(&rf))
        return 0;
    int all = filter_all(&rf);
    uint64_t end = limit > UINT64_MAX - offset ? UINT64_MAX : offset + limit;
    uint64_t pos = 0;
    tree_iter_t it;
    dr_tree_iter_start(d, &it, NULL, 0);
    for (uint32_t ref; (ref = dr_tree_iter_next(d, &it)) != NONE;) {
        if (all && pos >= end) {
            pos = d->nkeys;
            break;
        }
        if (!all && count_matching(d, ref, &rf) == 0)
            continue;
        if (pos >= offset && pos < end) {
            kvidx_dir_row_t row;
            dr_row_fill(d, ref, &rf, &row);
            int rc = cb(ctx, &row);
            if (rc) {
                if (total)
                    *total = pos + 1;
                return rc;
            }
        }
        pos++;
    }
    if (total)
        *total = pos;
    return 0;
}

int kvidx_directory_scan(const kvidx_directory_t *d, const kvidx_dir_filter_t *f,
                         const kvidx_key_t *after, size_t limit, size_t max_scan,
                         int (*cb)(void *ctx, kvidx_dir_row_t *row), void *ctx, kvidx_key_t *resume,
                         int *more)
{
    rfilter_t rf;
    dr_filter_resolve(d, f, &rf);
    *more = 0;
    if (filter_empty(&rf))
        return 0;
    tree_iter_t it;
    dr_tree_iter_start(d, &it, after, 1);
    size_t matched = 0, examined = 0;
    for (uint32_t ref; (ref = dr_tree_iter_next(d, &it)) != NONE;) {
        examined++;
        if (count_matching(d, ref, &rf)) {
            kvidx_dir_row_t row;
            dr_row_fill(d, ref, &rf, &row);
            int rc = cb(ctx, &row);
            if (rc)
                return rc;
            matched++;
        }
        if ((limit && matched == limit) || (max_scan && examined == max_scan)) {
            if (dr_tree_iter_next(d, &it) != NONE) {
                *more = 1;
                dr_key_view(d, ref, resume);
            }
            break;
        }
    }
    return 0;
}

int kvidx_directory_lookup(const kvidx_directory_t *d, const kvidx_key_t *key, kvidx_dir_row_t *row)
{
    rfilter_t all = {KVIDX_DIR_ALL, NONE, NONE};
    uint32_t ref = dr_key_find(d, dr_ns_find(d, key), key);
    if (ref != NONE) {
        dr_row_fill(d, ref, &all, row);
        return 0;
    }
    row->key = *key;
    row->last_access = 0.0;
    row->num_placements = 0;
    uint32_t rep = dr_chunk_find(d, key->hash, key->hash_len);
    row_tokens(d, rep == NONE ? NONE : K(d, rep)->bind, row);
    row->d_ = d;
    row->next_ = NONE;
    row->f_tier_ = KVIDX_DIR_ALL;
    row->f_inst_ = row->f_backend_ = NONE;
    return KVIDX_ENOTFOUND;
}

/* ---- score ---- */

#define SHARED_CAND NONE

typedef struct trip {
    uint32_t cand; /* reporter sid, or SHARED_CAND */
    uint32_t idx;
    uint8_t tier;
} trip_t;

static int trip_cmp(const void *a, const void *b)
{
    const trip_t *x = a, *y = b;
    if (x->cand != y->cand)
        return x->cand < y->cand ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int score_cmp(const void *a, const void *b)
{
    const kvidx_dir_score_t *x = a, *y = b;
    if (x->any_chunks != y->any_chunks)
        return x->any_chunks > y->any_chunks ? -1 : 1;
    if (x->l1_chunks != y->l1_chunks)
        return x->l1_chunks > y->l1_chunks ? -1 : 1;
    if (x->shared != y->shared)
        return x->shared - y->shared;
    return bytes_cmp(x->instance_id, x->instance_len, y->instance_id, y->instance_len);
}

void kvidx_directory_score_free(kvidx_dir_score_t *scores)
{
    kvidx_free(scores);
}

int kvidx_directory_score(const kvidx_directory_t *d, const kvidx_key_t *keys, size_t n,
                          const kvidx_fold_shape_t *shape, kvidx_dir_score_t **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    if (kvidx_fold_shape_check(shape) || kvidx_fold_num_keys(shape) != n || (n && !keys))
        return KVIDX_EINVAL;
    uint32_t *refs = n ? kvidx_malloc(n * sizeof(uint32_t)) : NULL;
    if (n && !refs)
        return KVIDX_ENOMEM;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        refs[i] = dr_key_find(d, dr_ns_find(d, &keys[i]), &keys[i]);
        if (refs[i] != NONE)
            for (uint32_t p = K(d, refs[i])->plist; !(p & KEY_TAG); p = P(d, p)->next)
                m++;
    }
    int rc = 0;
    trip_t *t = m ? kvidx_malloc(m * sizeof(trip_t)) : NULL;
    uint8_t *bits = m ? kvidx_calloc(3, n) : NULL;
    kvidx_dir_score_t *res = NULL;
    if (m && (!t || !bits)) {
        rc = KVIDX_ENOMEM;
        goto done;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (refs[i] == NONE)
            continue;
        for (uint32_t p = K(d, refs[i])->plist; !(p & KEY_TAG); p = P(d, p)->next) {
            const dsrc_t *s = S(d, P(d, p)->src);
            t[k++] = (trip_t){s->shared ? SHARED_CAND : s->inst, (uint32_t)i, s->tier};
        }
    }
    if (m)
        qsort(t, m, sizeof(trip_t), trip_cmp);
    size_t ncand = 0;
    for (size_t i = 0; i < m; i++)
        ncand += i == 0 || t[i].cand != t[i - 1].cand;
    if (ncand) {
        res = kvidx_calloc(ncand, sizeof(*res));
        if (!res) {
            rc = KVIDX_ENOMEM;
            goto done;
        }
    }
    /* No placement, no scratch: bits is NULL and offsets from it are undefined. */
    uint8_t *l1 = bits, *l2 = m ? bits + n : NULL, *any = m ? bits + 2 * n : NULL;
    size_t c = 0;
    for (size_t i = 0; i < m;) {
        size_t j = i;
        for (; j < m && t[j].cand == t[i].cand; j++) {
            (t[j].tier == KVIDX_DIR_L1 ? l1 : l2)[t[j].idx] = 1;
            any[t[j].idx] = 1;
        }
        kvidx_dir_score_t *r = &res[c++];
        if (t[i].cand == SHARED_CAND) {
            r->shared = 1;
        } else {
            r->instance_id = d->strs[t[i].cand].s;
            r->instance_len = d->strs[t[i].cand].len;
        }
        if ((rc = kvidx_fold(shape, l1, &r->l1_chunks)) ||
            (rc = kvidx_fold(shape, l2, &r->l2_chunks)) ||
            (rc = kvidx_fold(shape, any, &r->any_chunks)))
            goto done;
        for (; i < j; i++)
            l1[t[i].idx] = l2[t[i].idx] = any[t[i].idx] = 0;
    }
    if (ncand)
        qsort(res, ncand, sizeof(*res), score_cmp);
done:
    kvidx_free(refs);
    kvidx_free(t);
    kvidx_free(bits);
    if (rc) {
        kvidx_free(res);
        return rc;
    }
    *out = res;
    *count = ncand;
    return 0;
}
