/*
 * Interned strings, namespaces and instance records of the fleet directory.
 *
 * A string (instance id, backend, model name or salt) is stored once and
 * named by a sid; its refcount is the number of its users (namespaces,
 * sources, instance records, declared compartments, and pins held during a
 * call), and it is freed with its last user. A namespace is an interned
 * (salt, model) pair (the empty salt is NONE, no string), refcounted by its
 * keys. An instance record exists while anything names the instance; the
 * records sit in an array sorted by instance_id bytes, and each one's
 * string points back at it. Creating any of them allocates everything
 * first and changes nothing on KVIDX_ENOMEM.
 */
#include "directory_int.h"

#include "../siphash_int.h"

#include <sodium.h>

/* ---- strings ---- */

typedef struct str_probe {
    const char *s;
    size_t n;
} str_probe_t;

static uint64_t str_hash(const kvidx_directory_t *d, const char *s, size_t n)
{
    uint64_t h;
    crypto_shorthash((unsigned char *)&h, (const unsigned char *)s, n, d->hkey);
    return h;
}

uint64_t dr_str_hash_fn(const kvidx_directory_t *d, uint32_t sid)
{
    return d->strs[sid].hash;
}

static int str_eq(const kvidx_directory_t *d, uint32_t sid, const void *probe)
{
    const str_probe_t *p = probe;
    return d->strs[sid].len == p->n && (p->n == 0 || memcmp(d->strs[sid].s, p->s, p->n) == 0);
}

uint32_t dr_str_find(const kvidx_directory_t *d, const char *s, size_t n)
{
    str_probe_t p = {s, n};
    return dr_tab_find(d, &d->strtab, str_hash(d, s, n), str_eq, &p);
}

int dr_str_get(kvidx_directory_t *d, const char *s, size_t n, uint32_t *sid)
{
    uint64_t h = str_hash(d, s, n);
    str_probe_t p = {s, n};
    uint32_t id = dr_tab_find(d, &d->strtab, h, str_eq, &p);
    if (id != NONE) {
        d->strs[id].refs++;
        *sid = id;
        return 0;
    }
    if (d->str_free == NONE) {
        void *arr = d->strs;
        int rc = dr_grow(d, &arr, &d->strs_cap, (size_t)d->str_used + 1, sizeof(dstr_t));
        d->strs = arr;
        if (rc)
            return rc;
    }
    if (dr_tab_reserve(d, &d->strtab, d->strtab.count + 1, dr_str_hash_fn))
        return KVIDX_ENOMEM;
    char *copy = dr_alloc(d, n + 1);
    if (!copy)
        return KVIDX_ENOMEM;
    if (n)
        memcpy(copy, s, n);
    copy[n] = '\0';
    if (d->str_free != NONE) {
        id = d->str_free;
        d->str_free = d->strs[id].refs;
    } else {
        id = d->str_used++;
    }
    d->strs[id] = (dstr_t){copy, (uint32_t)n, 1, h, NULL};
    dr_tab_insert(&d->strtab, id, h);
    *sid = id;
    return 0;
}

void dr_str_ref(kvidx_directory_t *d, uint32_t sid)
{
    d->strs[sid].refs++;
}

void dr_str_unref(kvidx_directory_t *d, uint32_t sid)
{
    dstr_t *s = &d->strs[sid];
    if (--s->refs > 0)
        return;
    dr_tab_remove(d, &d->strtab, sid, s->hash, dr_str_hash_fn);
    dr_free(d, s->s, s->len + 1);
    s->s = NULL;
    s->len = 0;
    s->inst = NULL;
    s->refs = d->str_free;
    d->str_free = sid;
}

/* ---- namespaces ---- */

typedef struct ns_probe {
    uint32_t salt, model;
} ns_probe_t;

static uint64_t ns_hash(const kvidx_directory_t *d, uint32_t salt, uint32_t model)
{
    uint64_t w = (uint64_t)salt | (uint64_t)model << 32;
    return kvidx_siphash_words(d->hkey, &w, 1, 1, 3);
}

uint64_t dr_ns_hash_fn(const kvidx_directory_t *d, uint32_t ns)
{
    return ns_hash(d, d->ns[ns].salt, d->ns[ns].model);
}

static int ns_eq(const kvidx_directory_t *d, uint32_t ns, const void *probe)
{
    const ns_probe_t *p = probe;
    return d->ns[ns].salt == p->salt && d->ns[ns].model == p->model;
}

static uint32_t ns_lookup(const kvidx_directory_t *d, uint32_t salt, uint32_t model)
{
    ns_probe_t p = {salt, model};
    return dr_tab_find(d, &d->nstab, ns_hash(d, salt, model), ns_eq, &p);
}

uint32_t dr_ns_find(const kvidx_directory_t *d, const kvidx_key_t *k)
{
    uint32_t model = dr_str_find(d, k->model, k->model_len);
    if (model == NONE)
        return NONE;
    uint32_t salt = NONE;
    if (k->salt_len) {
        salt = dr_str_find(d, k->salt, k->salt_len);
        if (salt == NONE)
            return NONE;
    }
    return ns_lookup(d, salt, model);
}

int dr_ns_get(kvidx_directory_t *d, const kvidx_key_t *k, uint32_t *out)
{
    uint32_t id = dr_ns_find(d, k);
    if (id != NONE) {
        d->ns[id].refs++;
        *out = id;
        return 0;
    }
    if (d->ns_free == NONE) {
        void *arr = d->ns;
        int rc = dr_grow(d, &arr, &d->ns_cap, (size_t)d->ns_used + 1, sizeof(dns_t));
        d->ns = arr;
        if (rc)
            return rc;
    }
    if (dr_tab_reserve(d, &d->nstab, d->nstab.count + 1, dr_ns_hash_fn))
        return KVIDX_ENOMEM;
    uint32_t model, salt = NONE;
    if (dr_str_get(d, k->model, k->model_len, &model))
        return KVIDX_ENOMEM;
    if (k->salt_len && dr_str_get(d, k->salt, k->salt_len, &salt)) {
        dr_str_unref(d, model);
        return KVIDX_ENOMEM;
    }
    if (d->ns_free != NONE) {
        id = d->ns_free;
        d->ns_free = d->ns[id].refs;
    } else {
        id = d->ns_used++;
    }
    d->ns[id] = (dns_t){salt, model, 1, 1};
    dr_tab_insert(&d->nstab, id, ns_hash(d, salt, model));
    *out = id;
    return 0;
}

void dr_ns_unref(kvidx_directory_t *d, uint32_t id)
{
    dns_t *ns = &d->ns[id];
    if (--ns->refs > 0)
        return;
    dr_tab_remove(d, &d->nstab, id, ns_hash(d, ns->salt, ns->model), dr_ns_hash_fn);
    dr_str_unref(d, ns->model);
    if (ns->salt != NONE)
        dr_str_unref(d, ns->salt);
    *ns = (dns_t){NONE, NONE, d->ns_free, 0};
    d->ns_free = id;
}

/* ---- instance records ---- */

size_t dr_inst_index(const kvidx_directory_t *d, const char *id, size_t n, int *found)
{
    size_t lo = 0, hi = d->ninsts;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const dstr_t *s = &d->strs[d->insts[mid]->sid];
        int c = bytes_cmp(s->s, s->len, id, n);
        if (c == 0) {
            *found = 1;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = 0;
    return lo;
}

inst_t *dr_inst_find(const kvidx_directory_t *d, const char *id, size_t n)
{
    uint32_t sid = dr_str_find(d, id, n);
    return sid == NONE ? NULL : d->strs[sid].inst;
}

int dr_inst_get(kvidx_directory_t *d, const char *id, size_t n, inst_t **out)
{
    inst_t *in = dr_inst_find(d, id, n);
    if (in) {
        in->pins++;
        *out = in;
        return 0;
    }
    void *arr = d->insts;
    int rc = dr_grow(d, &arr, &d->insts_cap, d->ninsts + 1, sizeof(inst_t *));
    d->insts = arr;
    if (rc)
        return rc;
    in = dr_alloc(d, sizeof(*in));
    if (!in)
        return KVIDX_ENOMEM;
    memset(in, 0, sizeof(*in));
    if (dr_str_get(d, id, n, &in->sid)) {
        dr_free(d, in, sizeof(*in));
        return KVIDX_ENOMEM;
    }
    in->src_head = NONE;
    in->pins = 1;
    int found;
    size_t at = dr_inst_index(d, id, n, &found);
    memmove(d->insts + at + 1, d->insts + at, (d->ninsts - at) * sizeof(inst_t *));
    d->insts[at] = in;
    d->ninsts++;
    d->strs[in->sid].inst = in;
    *out = in;
    return 0;
}

void dr_inst_gc(kvidx_directory_t *d, inst_t *in)
{
    if (in->pins || in->src_head != NONE || in->has_cursor || in->registered || in->has_decl)
        return;
    const dstr_t *s = &d->strs[in->sid];
    int found;
    size_t at = dr_inst_index(d, s->s, s->len, &found);
    memmove(d->insts + at, d->insts + at + 1, (d->ninsts - at - 1) * sizeof(inst_t *));
    d->ninsts--;
    d->strs[in->sid].inst = NULL;
    uint32_t sid = in->sid;
    dr_free(d, in->caps, in->caps_cap * sizeof(dcap_t));
    dr_free(d, in, sizeof(*in));
    dr_str_unref(d, sid);
}

void dr_inst_unpin(kvidx_directory_t *d, inst_t *in)
{
    in->pins--;
    dr_inst_gc(d, in);
}
