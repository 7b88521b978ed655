/* The fleet directory against a reference model: plain arrays and linear
 * searches that state LMCache's rules as directly as possible. Random
 * batches (stale, duplicate, gapped, fencing), registrations, heartbeats,
 * expiries, cap changes, dump/load round trips, listings, scans and scores
 * drive both; after every step the directory's invariants are checked and
 * its whole state, as text, must equal the model's. */
#include <criterion/criterion.h>

#include "kvidx/directory.h"
#include "kvidx/err.h"

#include "directory_text.h"

/* Steps of the random walk: the sanitizer build runs a tenth as fast and
 * takes fewer, so that it stays inside the 300 s a unit test gets on a
 * 2-core machine; the normal build walks them all. */
#if defined(__SANITIZE_ADDRESS__)
#define STEPS 30000
#else
#define STEPS 100000
#endif
#define MAXK 128
#define MAXP 32
#define MAXB 128
#define MAXI 8

static const char *insts[] = {"a", "ab", "b", "c1"};
static const char *backends[] = {"dram", "fs", "cxl"};
static const char *models[] = {"m", "m/x"};
static const char *salts[] = {"", "s"};
static const uint8_t hlens[] = {8, 32, 32, 9, 64, 1};
#define NINST 4
#define NHASH 6

/* ---- random numbers ---- */

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return n ? (uint32_t)(rng % n) : 0;
}

/* ---- the model ---- */

typedef struct mpl {
    const char *inst;
    uint64_t inc;
    int tier;
    const char *backend;
    uint64_t size;
    int shared;
} mpl_t;

typedef struct mkey {
    kvidx_key_t k;
    double last_access;
    mpl_t pl[MAXP];
    int npl;
} mkey_t;

typedef struct mbind {
    uint8_t hash[64];
    uint8_t len;
    int64_t off;
    uint32_t tok[8];
    int n;
} mbind_t;

typedef struct mcur {
    const char *id;
    uint64_t inc, last_seq, applied, dup, stale;
    int gap;
    double last_ts;
} mcur_t;

typedef struct mreg {
    const char *id;
    char ip[16], meta[16], p2p[8];
    uint32_t http, mq;
    double reg_time;
    uint64_t last_seen;
} mreg_t;

typedef struct mcap {
    int tier;
    const char *backend;
    uint64_t cap;
    int shared;
} mcap_t;

typedef struct mdecl {
    const char *id;
    uint64_t inc, rev;
    mcap_t caps[8];
    int n;
} mdecl_t;

typedef struct model {
    mkey_t keys[MAXK];
    int nkeys;
    mbind_t binds[MAXB]; /* oldest first */
    int nbinds;
    mcur_t curs[MAXI];
    int ncurs;
    mreg_t regs[MAXI]; /* registration order */
    int nregs;
    mdecl_t decls[MAXI];
    int ndecls;
    uint64_t cap, dropped, tok_dropped;
    uint64_t fenced, all_dropped, max_keys; /* how much the walk exercised */
} model_t;

static model_t M;

static int str_eq(const char *a, const char *b)
{
    return strcmp(a, b) == 0;
}

static mkey_t *m_key(const kvidx_key_t *k)
{
    for (int i = 0; i < M.nkeys; i++)
        if (kvidx_key_equal(&M.keys[i].k, k))
            return &M.keys[i];
    return NULL;
}

static int m_bind_find(const uint8_t *h, uint8_t len)
{
    for (int i = 0; i < M.nbinds; i++)
        if (M.binds[i].len == len && memcmp(M.binds[i].hash, h, len) == 0)
            return i;
    return -1;
}

static void m_bind_remove(int i)
{
    memmove(&M.binds[i], &M.binds[i + 1], (size_t)(M.nbinds - i - 1) * sizeof(mbind_t));
    M.nbinds--;
}

static uint64_t m_bind_bytes(void)
{
    uint64_t b = 0;
    for (int i = 0; i < M.nbinds; i++)
        b += KVIDX_DIR_BINDING_OVERHEAD + 4 * (uint64_t)M.binds[i].n;
    return b;
}

static void m_enforce(void)
{
    while (M.cap && m_bind_bytes() > M.cap && M.nbinds) {
        M.dropped++;
        M.tok_dropped += (uint64_t)M.binds[0].n;
        m_bind_remove(0);
    }
}

static void m_bind_set(const kvidx_key_t *k, const uint32_t *tok, int n, int64_t off)
{
    int i = m_bind_find(k->hash, k->hash_len);
    if (M.cap && KVIDX_DIR_BINDING_OVERHEAD + 4 * (uint64_t)n > M.cap) {
        if (i >= 0) {
            M.dropped++;
            M.tok_dropped += (uint64_t)M.binds[i].n;
            m_bind_remove(i);
        }
        M.dropped++;
        M.tok_dropped += (uint64_t)n;
        return;
    }
    if (i >= 0)
        m_bind_remove(i);
    mbind_t *b = &M.binds[M.nbinds++];
    cr_assert_leq(M.nbinds, MAXB);
    memcpy(b->hash, k->hash, k->hash_len);
    b->len = k->hash_len;
    b->off = off;
    b->n = n;
    memcpy(b->tok, tok, 4 * (size_t)n);
    m_enforce();
}

static void m_forget(mkey_t *x)
{
    kvidx_key_t k = x->k;
    *x = M.keys[--M.nkeys];
    for (int i = 0; i < M.nkeys; i++)
        if (M.keys[i].k.hash_len == k.hash_len && memcmp(M.keys[i].k.hash, k.hash, k.hash_len) == 0)
            return;
    int b = m_bind_find(k.hash, k.hash_len);
    if (b >= 0)
        m_bind_remove(b);
}

static void m_pl_remove(mkey_t *x, int j)
{
    x->pl[j] = x->pl[--x->npl];
    if (x->npl == 0)
        m_forget(x);
}

static void m_fence(const char *inst)
{
    for (int i = 0; i < M.nkeys;) {
        mkey_t *x = &M.keys[i];
        int before = M.nkeys;
        for (int j = 0; j < x->npl;) {
            if (x->pl[j].tier == KVIDX_DIR_L1 && str_eq(x->pl[j].inst, inst)) {
                M.fenced++;
                m_pl_remove(x, j);
                if (M.nkeys != before)
                    break;
            } else {
                j++;
            }
        }
        if (M.nkeys == before)
            i++;
    }
}

static int m_identity(const mpl_t *p, const char *inst, int tier, const char *backend, int shared)
{
    return p->shared == shared && p->tier == tier && str_eq(p->backend, backend) &&
           (shared || str_eq(p->inst, inst));
}

static mcur_t *m_cur(const char *id)
{
    for (int i = 0; i < M.ncurs; i++)
        if (str_eq(M.curs[i].id, id))
            return &M.curs[i];
    return NULL;
}

static mdecl_t *m_decl(const char *id)
{
    for (int i = 0; i < M.ndecls; i++)
        if (str_eq(M.decls[i].id, id))
            return &M.decls[i];
    return NULL;
}

static void m_drop(const char *id)
{
    m_fence(id);
    mcur_t *c = m_cur(id);
    if (c)
        *c = M.curs[--M.ncurs];
    mdecl_t *dc = m_decl(id);
    if (dc)
        *dc = M.decls[--M.ndecls];
}

typedef struct mbatch {
    kvidx_dir_batch_t b;
    kvidx_dir_entry_t e[6];
    const char *inst, *backend;
    uint32_t tok[6][8];
    char model[6][8], salt[6][8];
} mbatch_t;

static kvidx_dir_verdict_t m_ingest(const mbatch_t *mb)
{
    const kvidx_dir_batch_t *b = &mb->b;
    mcur_t *c = m_cur(mb->inst);
    if (c) {
        if (b->incarnation < c->inc) {
            c->stale++;
            return KVIDX_DIR_STALE;
        }
        if (b->incarnation == c->inc && b->seq <= c->last_seq) {
            c->dup++;
            return KVIDX_DIR_DUPLICATE;
        }
        if (b->incarnation > c->inc) {
            m_fence(mb->inst);
            memset(c, 0, sizeof(*c));
            c->id = mb->inst;
            c->inc = b->incarnation;
        }
    } else {
        c = &M.curs[M.ncurs++];
        memset(c, 0, sizeof(*c));
        c->id = mb->inst;
        c->inc = b->incarnation;
    }
    if (b->seq > c->last_seq + 1)
        c->gap = 1;
    c->last_seq = b->seq;
    c->applied++;
    c->last_ts = b->ts;
    if (b->event_type == KVIDX_DIR_CONFIG) {
        mdecl_t *dc = m_decl(mb->inst);
        if (!dc) {
            dc = &M.decls[M.ndecls++];
            memset(dc, 0, sizeof(*dc));
            dc->id = mb->inst;
        } else if (b->incarnation < dc->inc ||
                   (b->incarnation == dc->inc && b->capacity_revision < dc->rev)) {
            return KVIDX_DIR_ADMITTED;
        } else if (b->incarnation != dc->inc || b->capacity_revision != dc->rev) {
            dc->n = 0;
        }
        dc->inc = b->incarnation;
        dc->rev = b->capacity_revision;
        for (int i = 0; i < dc->n; i++)
            if (dc->caps[i].tier == (int)b->tier && str_eq(dc->caps[i].backend, mb->backend)) {
                dc->caps[i].cap = b->capacity_bytes;
                dc->caps[i].shared = b->shared;
                return KVIDX_DIR_ADMITTED;
            }
        dc->caps[dc->n++] = (mcap_t){b->tier, mb->backend, b->capacity_bytes, b->shared};
        return KVIDX_DIR_ADMITTED;
    }
    for (size_t i = 0; i < b->num_entries; i++) {
        const kvidx_dir_entry_t *e = &b->entries[i];
        mkey_t *x = m_key(&e->key);
        if (b->event_type == KVIDX_DIR_STORE) {
            if (!x) {
                x = &M.keys[M.nkeys++];
                cr_assert_leq(M.nkeys, MAXK);
                memset(x, 0, sizeof(*x));
                x->k = e->key; /* model and salt are literals */
            }
            mpl_t np = {mb->inst, b->incarnation, b->tier, mb->backend, e->size_bytes, b->shared};
            int j = 0;
            for (; j < x->npl; j++)
                if (m_identity(&x->pl[j], mb->inst, b->tier, mb->backend, b->shared))
                    break;
            if (j == x->npl) {
                cr_assert_lt(x->npl, MAXP);
                x->npl++;
            }
            x->pl[j] = np;
            if (e->num_tokens)
                m_bind_set(&e->key, e->token_ids, (int)e->num_tokens, e->token_offset);
            if (b->ts > x->last_access)
                x->last_access = b->ts;
        } else if (x && b->event_type == KVIDX_DIR_ACCESS) {
            if (b->ts > x->last_access)
                x->last_access = b->ts;
        } else if (x && b->event_type == KVIDX_DIR_DELETE) {
            for (int j = 0; j < x->npl; j++)
                if (m_identity(&x->pl[j], mb->inst, b->tier, mb->backend, b->shared)) {
                    m_pl_remove(x, j);
                    break;
                }
        }
    }
    return KVIDX_DIR_ADMITTED;
}

static mreg_t *m_reg(const char *id, int *at)
{
    for (int i = 0; i < M.nregs; i++)
        if (str_eq(M.regs[i].id, id)) {
            if (at)
                *at = i;
            return &M.regs[i];
        }
    return NULL;
}

static void m_unregister(int at)
{
    memmove(&M.regs[at], &M.regs[at + 1], (size_t)(M.nregs - at - 1) * sizeof(mreg_t));
    M.nregs--;
}

/* ---- the model as text, in the dump's order ---- */

static int pl_cmp(const void *a, const void *b)
{
    const mpl_t *x = a, *y = b;
    int c = strcmp(x->inst, y->inst);
    if (c)
        return c;
    if (x->tier != y->tier)
        return x->tier - y->tier;
    c = strcmp(x->backend, y->backend);
    return c ? c : x->shared - y->shared;
}

static int keyp_cmp(const void *a, const void *b)
{
    return kvidx_key_cmp(&(*(mkey_t *const *)a)->k, &(*(mkey_t *const *)b)->k);
}

/* The model's keys in canonical order, each with its placements sorted as
 * the directory answers them (sorting in place changes no rule). */
static int m_sorted(mkey_t **out)
{
    for (int i = 0; i < M.nkeys; i++) {
        out[i] = &M.keys[i];
        qsort(out[i]->pl, (size_t)out[i]->npl, sizeof(mpl_t), pl_cmp);
    }
    qsort(out, (size_t)M.nkeys, sizeof(mkey_t *), keyp_cmp);
    return M.nkeys;
}

static int cur_cmp(const void *a, const void *b)
{
    return strcmp(((const mcur_t *)a)->id, ((const mcur_t *)b)->id);
}

static int decl_cmp(const void *a, const void *b)
{
    return strcmp(((const mdecl_t *)a)->id, ((const mdecl_t *)b)->id);
}

static char *m_text(void)
{
    tbuf_t t = {0};
    tb_printf(&t, "%s", "");
    for (int i = 0; i < M.nregs; i++) {
        const mreg_t *r = &M.regs[i];
        tb_printf(&t, "I %s %s %u %u %s %s %.17g %llu\n", r->id, r->ip, r->http, r->mq, r->p2p,
                  r->meta, r->reg_time, (unsigned long long)r->last_seen);
    }
    mcur_t curs[MAXI];
    memcpy(curs, M.curs, sizeof(curs));
    qsort(curs, (size_t)M.ncurs, sizeof(mcur_t), cur_cmp);
    for (int i = 0; i < M.ncurs; i++) {
        const mcur_t *c = &curs[i];
        tb_printf(&t, "S %s %llu %llu %d %llu %llu %llu %.17g\n", c->id, (unsigned long long)c->inc,
                  (unsigned long long)c->last_seq, c->gap, (unsigned long long)c->applied,
                  (unsigned long long)c->dup, (unsigned long long)c->stale, c->last_ts);
    }
    mdecl_t decls[MAXI];
    memcpy(decls, M.decls, sizeof(decls));
    qsort(decls, (size_t)M.ndecls, sizeof(mdecl_t), decl_cmp);
    for (int i = 0; i < M.ndecls; i++)
        for (int j = 0; j < decls[i].n; j++) {
            const mcap_t *c = &decls[i].caps[j];
            tb_printf(&t, "C %s %llu %llu %s %s %llu %d\n", decls[i].id,
                      (unsigned long long)decls[i].inc, (unsigned long long)decls[i].rev,
                      tier_name(c->tier), c->backend, (unsigned long long)c->cap, c->shared);
        }
    mkey_t *keys[MAXK];
    m_sorted(keys);
    for (int i = 0; i < M.nkeys; i++) {
        const mkey_t *x = keys[i];
        tb_str(&t, "K ");
        tb_key(&t, &x->k);
        tb_str(&t, " ");
        tb_f64(&t, x->last_access);
        tb_str(&t, " :");
        for (int j = 0; j < x->npl; j++) {
            const mpl_t *p = &x->pl[j];
            kvidx_dir_placement_t v = {p->inst,    strlen(p->inst),    p->inc,  p->tier,
                                       p->backend, strlen(p->backend), p->size, p->shared};
            tb_placement(&t, &v);
        }
        tb_printf(&t, "\n");
    }
    for (int i = 0; i < M.nbinds; i++) {
        const mbind_t *b = &M.binds[i];
        tb_printf(&t, "B ");
        tb_hex(&t, b->hash, b->len);
        tb_printf(&t, " %lld", (long long)b->off);
        for (int j = 0; j < b->n; j++)
            tb_printf(&t, "%c%u", j ? ',' : ' ', b->tok[j]);
        tb_printf(&t, "\n");
    }
    tb_printf(&t, "cap %llu dropped %llu %llu\n", (unsigned long long)M.cap,
              (unsigned long long)M.dropped, (unsigned long long)M.tok_dropped);
    return t.s;
}

/* ---- generating operations ---- */

static kvidx_key_t rnd_key(void)
{
    unsigned h = rnd(NHASH);
    return mkkey_len(models[rnd(2)], salts[rnd(2)], rnd(2), (uint16_t)rnd(2), h + 1, hlens[h]);
}

static void gen_batch(mbatch_t *mb, kvidx_dir_event_t ev)
{
    memset(mb, 0, sizeof(*mb));
    mb->inst = insts[rnd(NINST)];
    const mcur_t *c = m_cur(mb->inst);
    uint64_t inc, seq;
    if (!c) {
        inc = rnd(6);
        seq = 1 + rnd(3);
    } else {
        uint32_t r = rnd(10);
        inc = r < 7 ? c->inc : r == 7 ? c->inc + 1 : r == 8 && c->inc ? c->inc - 1 : rnd(6);
        r = rnd(20);
        seq = r < 12   ? c->last_seq + 1
              : r < 15 ? c->last_seq + 2 + rnd(3)
                       : 1 + rnd((uint32_t)c->last_seq + 1);
    }
    mb->backend = ev == KVIDX_DIR_ACCESS && rnd(2) ? "" : backends[rnd(3)];
    size_t n = ev == KVIDX_DIR_CONFIG ? 0 : rnd(6);
    for (size_t i = 0; i < n; i++) {
        kvidx_dir_entry_t *e = &mb->e[i];
        *e = mkentry(rnd_key(), ev == KVIDX_DIR_STORE ? 1 + rnd(1000) : 0);
        if (ev == KVIDX_DIR_STORE && rnd(5) < 2) {
            e->num_tokens = 1 + rnd(4);
            for (size_t j = 0; j < e->num_tokens; j++)
                mb->tok[i][j] = rnd(3);
            e->token_ids = mb->tok[i];
            e->token_offset = rnd(3) ? KVIDX_DIR_UNKNOWN_OFFSET : (int64_t)rnd(512);
        }
    }
    mb->b = mkbatch(mb->inst, inc, seq, ev, rnd(2) ? KVIDX_DIR_L1 : KVIDX_DIR_L2, mb->backend,
                    mb->e, n);
    mb->b.shared = rnd(7) == 0;
    mb->b.ts = rnd(2000) / 2.0;
    if (ev == KVIDX_DIR_CONFIG) {
        mb->b.capacity_revision = rnd(4);
        mb->b.capacity_bytes = rnd(3) * 1000;
    }
}

static kvidx_directory_t *new_dir(uint64_t cap)
{
    kvidx_dir_options_t o = {.token_bytes_cap = cap};
    kvidx_directory_t *d;
    cr_assert_eq(kvidx_directory_new(&o, &d), 0);
    return d;
}

static int load_rec(void *ctx, const kvidx_dir_record_t *r)
{
    cr_assert_eq(kvidx_directory_load(ctx, r), 0);
    return 0;
}

/* ---- listings, scans and scores against the model ---- */

static int m_pl_match(const mpl_t *p, const kvidx_dir_filter_t *f)
{
    return (f->tier == KVIDX_DIR_ALL || p->tier == (int)f->tier) &&
           (!f->instance_len || str_eq(p->inst, f->instance_id)) &&
           (!f->backend_len || str_eq(p->backend, f->backend));
}

/* The model's keys matching f, as listing lines, from position off, at
 * most lim (0: all); *total gets the count. */
static char *m_list(const kvidx_dir_filter_t *f, uint64_t off, uint64_t lim, uint64_t *total)
{
    mkey_t *keys[MAXK];
    m_sorted(keys);
    tbuf_t t = {0};
    tb_printf(&t, "%s", "");
    uint64_t pos = 0;
    for (int i = 0; i < M.nkeys; i++) {
        const mkey_t *x = keys[i];
        int any = 0;
        for (int j = 0; j < x->npl; j++)
            any |= m_pl_match(&x->pl[j], f);
        if (!any)
            continue;
        if (pos >= off && (!lim || pos < off + lim)) {
            tb_key(&t, &x->k);
            tb_printf(&t, ":");
            for (int j = 0; j < x->npl; j++)
                if (m_pl_match(&x->pl[j], f))
                    tb_printf(&t, "%s,%s,%s;", x->pl[j].inst, tier_name(x->pl[j].tier),
                              x->pl[j].backend);
            tb_printf(&t, "\n");
        }
        pos++;
    }
    *total = pos;
    return t.s;
}

static int row_line(void *ctx, kvidx_dir_row_t *row)
{
    tbuf_t *t = ctx;
    tb_key(t, &row->key);
    tb_printf(t, ":");
    kvidx_dir_placement_t p;
    size_t n = 0;
    while (kvidx_directory_row_next(row, &p)) {
        tb_bytes(t, p.instance_id, p.instance_len);
        tb_printf(t, ",%s,", tier_name(p.tier));
        tb_bytes(t, p.backend, p.backend_len);
        tb_printf(t, ";");
        n++;
    }
    cr_assert_eq(n, row->num_placements);
    tb_printf(t, "\n");
    return 0;
}

static kvidx_dir_filter_t rnd_filter(void)
{
    static const char *fi[] = {"", "a", "ab", "b", "c1", "zz"};
    static const char *fb[] = {"", "dram", "fs", "cxl", "nvme"};
    kvidx_dir_filter_t f = {.tier = rnd(3)};
    f.instance_id = fi[rnd(6)];
    f.instance_len = strlen(f.instance_id);
    f.backend = fb[rnd(5)];
    f.backend_len = strlen(f.backend);
    return f;
}

static void check_list(const kvidx_directory_t *d)
{
    kvidx_dir_filter_t f = rnd_filter();
    uint64_t off = rnd(6), lim = 1 + rnd(8), total = 0, mtotal = 0;
    tbuf_t t = {0};
    tb_printf(&t, "%s", "");
    cr_assert_eq(kvidx_directory_list(d, &f, off, lim, row_line, &t, &total), 0);
    char *want = m_list(&f, off, lim, &mtotal);
    cr_assert_str_eq(t.s, want);
    cr_assert_eq(total, mtotal);
    free(want);
    /* The whole listing again, in pages of the resumable scan. */
    t.len = 0;
    t.s[0] = '\0';
    kvidx_key_t after, resume;
    char am[16], as[16];
    const kvidx_key_t *ap = NULL;
    size_t page = 1 + rnd(5), max_scan = rnd(2) ? 0 : 1 + rnd(6);
    for (int more = 1, guard = 0; more; guard++) {
        cr_assert_lt(guard, 1000);
        cr_assert_eq(kvidx_directory_scan(d, &f, ap, page, max_scan, row_line, &t, &resume, &more),
                     0);
        if (more) {
            after = resume;
            memcpy(am, resume.model, resume.model_len);
            memcpy(as, resume.salt, resume.salt_len);
            after.model = am;
            after.salt = as;
            ap = &after;
        }
    }
    want = m_list(&f, 0, 0, &mtotal);
    cr_assert_str_eq(t.s, want);
    free(want);
    free(t.s);
}

#define SHARED_SENTINEL "(shared)"

static size_t m_prefix(const kvidx_fold_shape_t *s, const uint8_t *avail)
{
    size_t G = s->num_groups, C = s->num_chunks, R = s->num_ranks;
    for (size_t L = C;; L--) {
        int ok = 1;
        for (size_t g = 0; g < G && ok; g++) {
            size_t lo =
                s->windows[g] < 0 || (size_t)s->windows[g] >= L ? 0 : L - (size_t)s->windows[g];
            for (size_t c = lo; c < L && ok; c++)
                for (size_t r = 0; r < R; r++)
                    ok &= avail[g * C * R + c * R + r] != 0;
        }
        if (ok || L == 0)
            return L;
    }
}

static void check_score(const kvidx_directory_t *d)
{
    int64_t windows[2];
    kvidx_fold_shape_t s = {windows, 1 + rnd(2), 1 + rnd(4), 1 + rnd(2)};
    for (size_t g = 0; g < s.num_groups; g++)
        windows[g] = rnd(3) ? -1 : 1 + (int64_t)rnd(3);
    const char *salt = salts[rnd(2)];
    size_t n = s.num_groups * s.num_chunks * s.num_ranks;
    kvidx_key_t keys[16];
    for (size_t g = 0; g < s.num_groups; g++)
        for (size_t c = 0; c < s.num_chunks; c++)
            for (size_t r = 0; r < s.num_ranks; r++) {
                unsigned h = (unsigned)(c + rnd(2)) % NHASH;
                keys[g * s.num_chunks * s.num_ranks + c * s.num_ranks + r] =
                    mkkey_len("m", salt, (uint32_t)r, (uint16_t)g, h + 1, hlens[h]);
            }
    kvidx_dir_score_t *got;
    size_t ngot;
    cr_assert_eq(kvidx_directory_score(d, keys, n, &s, &got, &ngot), 0);
    /* The model: every reporter of a private placement, and shared storage. */
    const char *cands[NINST + 1];
    size_t ncand = 0;
    for (size_t i = 0; i < n; i++) {
        const mkey_t *x = m_key(&keys[i]);
        for (int j = 0; x && j < x->npl; j++) {
            const char *c = x->pl[j].shared ? SHARED_SENTINEL : x->pl[j].inst;
            size_t k = 0;
            while (k < ncand && !str_eq(cands[k], c))
                k++;
            if (k == ncand)
                cands[ncand++] = c;
        }
    }
    cr_assert_eq(ngot, ncand);
    kvidx_dir_score_t want[NINST + 1];
    for (size_t k = 0; k < ncand; k++) {
        uint8_t av[3][16] = {{0}};
        for (size_t i = 0; i < n; i++) {
            const mkey_t *x = m_key(&keys[i]);
            for (int j = 0; x && j < x->npl; j++) {
                const mpl_t *p = &x->pl[j];
                if (!str_eq(p->shared ? SHARED_SENTINEL : p->inst, cands[k]))
                    continue;
                av[p->tier - 1][i] = 1;
                av[2][i] = 1;
            }
        }
        int sh = str_eq(cands[k], SHARED_SENTINEL);
        want[k] = (kvidx_dir_score_t){
            sh ? NULL : cands[k], sh ? 0 : strlen(cands[k]), sh,
            m_prefix(&s, av[0]),  m_prefix(&s, av[1]),       m_prefix(&s, av[2])};
    }
    /* Best first: any, then L1, descending; instances by id, shared last. */
    for (size_t a = 0; a < ncand; a++)
        for (size_t b = a + 1; b < ncand; b++) {
            kvidx_dir_score_t *x = &want[a], *y = &want[b];
            int swap =
                y->any_chunks > x->any_chunks ||
                (y->any_chunks == x->any_chunks &&
                 (y->l1_chunks > x->l1_chunks ||
                  (y->l1_chunks == x->l1_chunks &&
                   (x->shared > y->shared || (x->shared == y->shared && !x->shared &&
                                              strcmp(y->instance_id, x->instance_id) < 0)))));
            if (swap) {
                kvidx_dir_score_t t = *x;
                *x = *y;
                *y = t;
            }
        }
    for (size_t k = 0; k < ncand; k++) {
        cr_assert_eq(got[k].shared, want[k].shared, "entry %zu", k);
        if (!want[k].shared) {
            cr_assert_eq(got[k].instance_len, want[k].instance_len);
            cr_assert_eq(memcmp(got[k].instance_id, want[k].instance_id, want[k].instance_len), 0);
        }
        cr_assert_eq(got[k].l1_chunks, want[k].l1_chunks, "entry %zu", k);
        cr_assert_eq(got[k].l2_chunks, want[k].l2_chunks, "entry %zu", k);
        cr_assert_eq(got[k].any_chunks, want[k].any_chunks, "entry %zu", k);
    }
    kvidx_directory_score_free(got);
}

/* ---- the walk ---- */

static void compare(const kvidx_directory_t *d, long step)
{
    cr_assert_eq(kvidx_directory_check(d), 0, "invariant broken at step %ld", step);
    char *a = dir_text(d), *b = m_text();
    cr_assert_not_null(a);
    if (strcmp(a, b) != 0)
        cr_assert_str_eq(a, b, "state differs at step %ld", step);
    free(a);
    free(b);
}

static void do_register(kvidx_directory_t *d, uint64_t now)
{
    const char *id = insts[rnd(NINST)];
    mreg_t r = {.id = id,
                .http = 1 + rnd(65535),
                .mq = rnd(3) ? 0 : rnd(65536),
                .reg_time = rnd(100000) / 4.0,
                .last_seen = now};
    snprintf(r.ip, sizeof(r.ip), "10.0.0.%u", rnd(255));
    snprintf(r.meta, sizeof(r.meta), "%s", rnd(2) ? "{}" : "{\"k\":\"v\"}");
    snprintf(r.p2p, sizeof(r.p2p), "%s", rnd(2) ? "" : "tcp://x");
    kvidx_dir_instance_t x = {id,     strlen(id),     r.ip,       strlen(r.ip),
                              r.http, r.mq,           r.p2p,      strlen(r.p2p),
                              r.meta, strlen(r.meta), r.reg_time, r.last_seen};
    int re = -1;
    cr_assert_eq(kvidx_directory_register(d, &x, &re), 0);
    mreg_t *old = m_reg(id, NULL);
    cr_assert_eq(re, old != NULL);
    if (old)
        *old = r;
    else
        M.regs[M.nregs++] = r;
}

static void do_expire(kvidx_directory_t *d, uint64_t now, uint64_t timeout)
{
    size_t n = 0, want = 0;
    kvidx_directory_expire(d, now, timeout, &n);
    for (int i = 0; i < M.nregs;) {
        if (now > M.regs[i].last_seen && now - M.regs[i].last_seen > timeout) {
            const char *id = M.regs[i].id;
            m_unregister(i);
            m_drop(id);
            want++;
        } else {
            i++;
        }
    }
    cr_assert_eq(n, want);
}

Test(directory_model, random_walk, .timeout = 900)
{
    memset(&M, 0, sizeof(M));
    kvidx_directory_t *d = new_dir(0);
    uint64_t now = 0;
    long stats[8] = {0};
    for (long step = 0; step < STEPS; step++) {
        uint32_t op = rnd(100);
        now += rnd(3000);
        if (op < 62) {
            kvidx_dir_event_t ev = op < 35   ? KVIDX_DIR_STORE
                                   : op < 50 ? KVIDX_DIR_DELETE
                                   : op < 57 ? KVIDX_DIR_ACCESS
                                             : KVIDX_DIR_CONFIG;
            mbatch_t mb;
            gen_batch(&mb, ev);
            kvidx_dir_verdict_t got, want;
            cr_assert_eq(kvidx_directory_classify(d, &mb.b), (want = m_ingest(&mb)));
            cr_assert_eq(kvidx_directory_ingest(d, &mb.b, &got), 0);
            cr_assert_eq(got, want, "verdict at step %ld", step);
            stats[got]++;
        } else if (op < 64) {
            mbatch_t mb;
            gen_batch(&mb, KVIDX_DIR_STORE);
            mb.b.seq = 0;
            cr_assert_eq(kvidx_directory_ingest(d, &mb.b, NULL), KVIDX_EINVAL);
        } else if (op < 70) {
            do_register(d, now);
        } else if (op < 78) {
            const char *id = insts[rnd(NINST)];
            mreg_t *r = m_reg(id, NULL);
            int rc = kvidx_directory_heartbeat(d, id, strlen(id), now);
            cr_assert_eq(rc, r ? 0 : KVIDX_ENOTFOUND);
            if (r)
                r->last_seen = now;
        } else if (op < 81) {
            const char *id = insts[rnd(NINST)];
            int at;
            mreg_t *r = m_reg(id, &at);
            cr_assert_eq(kvidx_directory_deregister(d, id, strlen(id)), r ? 0 : KVIDX_ENOTFOUND);
            if (r) {
                m_unregister(at);
                m_drop(id);
            }
        } else if (op < 86) {
            do_expire(d, now, 10000);
            stats[5]++;
        } else if (op < 87) {
            static const uint64_t caps[] = {0, 100, 200, 400};
            M.cap = caps[rnd(4)];
            kvidx_directory_set_token_cap(d, M.cap);
            m_enforce();
        } else if (op < 88) {
            kvidx_directory_t *e = new_dir(M.cap);
            cr_assert_eq(kvidx_directory_dump(d, load_rec, e), 0);
            kvidx_directory_free(d);
            d = e;
            M.all_dropped += M.dropped;
            M.dropped = M.tok_dropped = 0; /* counters start again with the new directory */
            stats[6]++;
        } else if (op < 95) {
            check_list(d);
        } else {
            check_score(d);
        }
        compare(d, step);
        if ((uint64_t)M.nkeys > M.max_keys)
            M.max_keys = (uint64_t)M.nkeys;
    }
    /* The walk must have met every verdict and kept a non-trivial state. */
    cr_assert_gt(stats[KVIDX_DIR_ADMITTED], 1000);
    cr_assert_gt(stats[KVIDX_DIR_DUPLICATE], 1000);
    cr_assert_gt(stats[KVIDX_DIR_STALE], 1000);
    cr_assert_gt(M.fenced, 1000, "fences removed L1 placements");
    cr_assert_gt(M.all_dropped + M.dropped, 100, "the token cap dropped bindings");
    cr_assert_gt(M.max_keys, 40, "the state grew beyond a handful of keys");
    cr_assert_gt(stats[6], 100, "dump/load round trips");
    kvidx_directory_free(d);
}
