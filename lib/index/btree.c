/*
 * The B+tree of each namespace.
 *
 * A namespace's tree holds the refs of its keys, ordered strictly by
 * (kv_rank, object_group_id, hash bytes, shorter hash first), in leaves
 * chained left to right from ns->first. All leaves are at depth ns->height
 * and none is empty (a leaf that loses its last key is freed, as is an
 * inner node that loses its last child, and a root with one child
 * collapses); there is no other rebalancing on delete. A full node shares
 * its keys with a sibling that has room before it splits (leaf_share,
 * inner_share), so nodes stay fuller than the half that a split leaves. Separators in inner nodes
 * are copies of keys, never refs, so deleting a record never leaves a dangling separator: every key
 * under child i of a node is >= separator i - 1 and < separator i. An insert never fails half-way:
 * tree_prepare (index_int.h) first puts one leaf and height + 1 inner nodes in reserve, and
 * deletion never allocates.
 */
#include "index_int.h"

static void sep_from_rec(skey_t *s, const uint8_t *r)
{
    s->rank = rec_rank(r);
    s->group = rec_group(r);
    s->hash_len = rec_hl(r);
    memcpy(s->hash, rec_hash(r), s->hash_len);
}

/* Number of separators <= t: the child to descend into. */
static uint32_t inner_pick(const inner_t *in, const tkey_t *t)
{
    uint32_t lo = 0, hi = in->n - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (tk_cmp_sep(t, &in->sep[mid]) >= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* First position in the leaf whose key is > t (strict) or >= t. */
static uint32_t leaf_pos(const kvidx_index_t *idx, const leaf_t *l, const tkey_t *t, int strict)
{
    uint32_t lo = 0, hi = l->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        int c = tk_cmp_rec(t, rec_at(idx, l->refs[mid]));
        if (c > 0 || (strict && c == 0))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* tree_prepare's allocating part: one leaf and height + 1 inner nodes
 * in reserve. */
int ix_tree_prepare_slow(kvidx_index_t *idx, const ns_t *ns)
{
    if (!idx->spare_leaf) {
        idx->spare_leaf = kvidx_malloc(sizeof(leaf_t));
        if (!idx->spare_leaf)
            return KVIDX_ENOMEM;
    }
    uint32_t need = ns->height + 1;
    if (need > MAXH)
        return KVIDX_ECAPACITY;
    while (idx->nspare_inner < need) {
        inner_t *in = kvidx_malloc(sizeof(inner_t));
        if (!in)
            return KVIDX_ENOMEM;
        idx->spare_inner[idx->nspare_inner++] = in;
    }
    return 0;
}

static leaf_t *take_leaf(kvidx_index_t *idx)
{
    leaf_t *l = idx->spare_leaf;
    idx->spare_leaf = NULL;
    return l;
}

static inner_t *take_inner(kvidx_index_t *idx)
{
    return idx->spare_inner[--idx->nspare_inner];
}

/* A full node shares its keys with a sibling that has this many free
 * slots or more, instead of splitting. */
#define SHARE_MIN 8

/* Puts (sep, child) into the inner node in, which has room, as child
 * number pos with sep on its left. */
static void inner_put(inner_t *in, uint32_t pos, const skey_t *sep, void *child)
{
    memmove(&in->sep[pos], &in->sep[pos - 1], (in->n - pos) * sizeof(skey_t));
    memmove(&in->child[pos + 1], &in->child[pos], (in->n - pos) * sizeof(void *));
    in->sep[pos - 1] = *sep;
    in->child[pos] = child;
    in->n++;
}

/* Puts (sep, child) as child number pos of the full inner node at level
 * d of the path by first moving children to a sibling of the same parent
 * that has room: half of the sibling's room, through the parent's
 * separator between the two (a rotation), as leaf_share does for leaves;
 * 0 when neither sibling has room. */
static int inner_share(inner_t **path, const uint32_t *pidx, int d, uint32_t pos, const skey_t *sep,
                       void *child)
{
    if (d == 0)
        return 0;
    inner_t *in = path[d], *p = path[d - 1];
    uint32_t i = pidx[d - 1];
    if (i + 1 < p->n && ((inner_t *)p->child[i + 1])->n <= INNER_CAP - SHARE_MIN) {
        /* The last m children of in go to the front of its right sibling. */
        inner_t *b = p->child[i + 1];
        uint32_t m = (INNER_CAP - b->n + 1) / 2, keep = in->n - m;
        memmove(&b->sep[m], &b->sep[0], (b->n - 1) * sizeof(skey_t));
        memmove(&b->child[m], &b->child[0], b->n * sizeof(void *));
        b->sep[m - 1] = p->sep[i];
        memcpy(&b->sep[0], &in->sep[keep], (m - 1) * sizeof(skey_t));
        memcpy(&b->child[0], &in->child[keep], m * sizeof(void *));
        b->n += m;
        p->sep[i] = in->sep[keep - 1];
        in->n = keep;
        if (pos <= keep)
            inner_put(in, pos, sep, child);
        else
            inner_put(b, pos - keep, sep, child);
        return 1;
    }
    if (i > 0 && ((inner_t *)p->child[i - 1])->n <= INNER_CAP - SHARE_MIN) {
        /* The first m children of in go to the end of its left sibling. */
        inner_t *a = p->child[i - 1];
        uint32_t m = (INNER_CAP - a->n + 1) / 2, na = a->n;
        a->sep[na - 1] = p->sep[i - 1];
        memcpy(&a->sep[na], &in->sep[0], (m - 1) * sizeof(skey_t));
        memcpy(&a->child[na], &in->child[0], m * sizeof(void *));
        a->n += m;
        p->sep[i - 1] = in->sep[m - 1];
        memmove(&in->sep[0], &in->sep[m], (in->n - 1 - m) * sizeof(skey_t));
        memmove(&in->child[0], &in->child[m], (in->n - m) * sizeof(void *));
        in->n -= m;
        if (pos <= m)
            inner_put(a, na + pos, sep, child);
        else
            inner_put(in, pos - m, sep, child);
        return 1;
    }
    return 0;
}

/* Inserts (sep, child) as child number pos of the inner node at level d of
 * the path, sharing with a sibling or splitting upward as needed. */
static void inner_insert(kvidx_index_t *idx, ns_t *ns, inner_t **path, uint32_t *pidx, int d,
                         const skey_t *sep, void *child)
{
    skey_t up;
    for (;; d--) {
        inner_t *in = path[d];
        uint32_t pos = pidx[d] + 1;
        if (in->n < INNER_CAP) {
            inner_put(in, pos, sep, child);
            return;
        }
        if (inner_share(path, pidx, d, pos, sep, child))
            return;
        /* Split: gather n + 1 children and n separators, halve them. */
        skey_t seps[INNER_CAP];
        void *kids[INNER_CAP + 1];
        memcpy(seps, in->sep, (pos - 1) * sizeof(skey_t));
        seps[pos - 1] = *sep;
        memcpy(seps + pos, in->sep + pos - 1, (INNER_CAP - pos) * sizeof(skey_t));
        memcpy(kids, in->child, pos * sizeof(void *));
        kids[pos] = child;
        memcpy(kids + pos + 1, in->child + pos, (INNER_CAP - pos) * sizeof(void *));
        uint32_t total = INNER_CAP + 1, m = total / 2;
        inner_t *right = take_inner(idx);
        in->n = m;
        memcpy(in->child, kids, m * sizeof(void *));
        memcpy(in->sep, seps, (m - 1) * sizeof(skey_t));
        up = seps[m - 1];
        right->n = total - m;
        memcpy(right->child, kids + m, right->n * sizeof(void *));
        memcpy(right->sep, seps + m, (right->n - 1) * sizeof(skey_t));
        if (d == 0) {
            inner_t *root = take_inner(idx);
            root->n = 2;
            root->child[0] = in;
            root->child[1] = right;
            root->sep[0] = up;
            ns->root = root;
            ns->height++;
            return;
        }
        sep = &up;
        child = right;
    }
}

/* Walks from the root to the leaf where t belongs, recording the inner
 * nodes passed and the child index taken at each depth. */
static leaf_t *tree_descend(const ns_t *ns, const tkey_t *t, inner_t **path, uint32_t *pidx)
{
    void *node = ns->root;
    for (uint32_t d = 0; d < ns->height; d++) {
        inner_t *in = node;
        path[d] = in;
        pidx[d] = inner_pick(in, t);
        node = in->child[pidx[d]];
    }
    return node;
}

/* Inserts ref at position pos of the full leaf l (reached by path/pidx)
 * by sharing the keys of l and a sibling of the same parent that has room
 * evenly between the two, and moving the separator between them to the
 * right one's first key; 0 when neither sibling has room. A split leaves
 * two half-full leaves, so under inserts in random order leaves settle
 * near 70% full; sharing first keeps them fuller for the price of a copy
 * of the two leaves, no more than a split costs. */
static int leaf_share(kvidx_index_t *idx, const ns_t *ns, inner_t **path, const uint32_t *pidx,
                      leaf_t *l, uint32_t pos, kvidx_ref_t ref)
{
    if (ns->height == 0)
        return 0;
    inner_t *p = path[ns->height - 1];
    uint32_t i = pidx[ns->height - 1];
    leaf_t *a, *b; /* the left and right leaf of the pair */
    uint32_t s;    /* the separator between them */
    if (i + 1 < p->n && ((leaf_t *)p->child[i + 1])->n <= LEAF_CAP - SHARE_MIN) {
        a = l;
        b = p->child[i + 1];
        s = i;
    } else if (i > 0 && ((leaf_t *)p->child[i - 1])->n <= LEAF_CAP - SHARE_MIN) {
        a = p->child[i - 1];
        b = l;
        s = i - 1;
        pos += a->n;
    } else {
        return 0;
    }
    uint32_t all[2 * LEAF_CAP];
    uint32_t total = a->n + b->n + 1;
    memcpy(all, a->refs, a->n * sizeof(uint32_t));
    memcpy(all + a->n, b->refs, b->n * sizeof(uint32_t));
    memmove(all + pos + 1, all + pos, (total - 1 - pos) * sizeof(uint32_t));
    all[pos] = ref;
    a->n = total / 2;
    b->n = total - a->n;
    memcpy(a->refs, all, a->n * sizeof(uint32_t));
    memcpy(b->refs, all + a->n, b->n * sizeof(uint32_t));
    sep_from_rec(&p->sep[s], rec_at(idx, b->refs[0]));
    return 1;
}

/* Inserts ref at position pos of leaf l, reached by path/pidx; shares
 * with a sibling or splits upward as needed. tree_prepare must have
 * succeeded. */
static void tree_insert_at(kvidx_index_t *idx, ns_t *ns, inner_t **path, uint32_t *pidx, leaf_t *l,
                           uint32_t pos, kvidx_ref_t ref)
{
    if (l->n < LEAF_CAP) {
        memmove(&l->refs[pos + 1], &l->refs[pos], (l->n - pos) * sizeof(uint32_t));
        l->refs[pos] = ref;
        l->n++;
        return;
    }
    /* Appending at the end of a full leaf (ascending inserts) moves only
     * the new key to a new leaf on the right, so such leaves stay full;
     * any other insert into a full leaf shares with a sibling if one has
     * room, else splits the leaf in halves. */
    if (pos < LEAF_CAP && leaf_share(idx, ns, path, pidx, l, pos, ref))
        return;
    leaf_t *r = take_leaf(idx);
    if (pos == LEAF_CAP) {
        r->n = 1;
        r->refs[0] = ref;
    } else {
        uint32_t m = LEAF_CAP / 2;
        r->n = LEAF_CAP - m;
        memcpy(r->refs, l->refs + m, r->n * sizeof(uint32_t));
        l->n = m;
        leaf_t *dst = pos <= m ? l : r;
        uint32_t p = pos <= m ? pos : pos - m;
        memmove(&dst->refs[p + 1], &dst->refs[p], (dst->n - p) * sizeof(uint32_t));
        dst->refs[p] = ref;
        dst->n++;
    }
    r->prev = l;
    r->next = l->next;
    if (l->next)
        l->next->prev = r;
    l->next = r;
    skey_t sep;
    sep_from_rec(&sep, rec_at(idx, r->refs[0]));
    if (ns->height == 0) {
        inner_t *root = take_inner(idx);
        root->n = 2;
        root->child[0] = l;
        root->child[1] = r;
        root->sep[0] = sep;
        ns->root = root;
        ns->height = 1;
        return;
    }
    inner_insert(idx, ns, path, pidx, (int)ns->height - 1, &sep, r);
}

/* Makes ref the only key of an empty tree. */
static void tree_start(kvidx_index_t *idx, ns_t *ns, kvidx_ref_t ref)
{
    leaf_t *l = take_leaf(idx);
    l->prev = l->next = NULL;
    l->n = 1;
    l->refs[0] = ref;
    ns->root = l;
    ns->height = 0;
    ns->first = l;
}

/* Inserts ref (whose record holds key t, absent from the tree);
 * tree_prepare must have succeeded. */
void ix_tree_insert(kvidx_index_t *idx, ns_t *ns, const tkey_t *t, kvidx_ref_t ref)
{
    if (!ns->root) {
        tree_start(idx, ns, ref);
        return;
    }
    inner_t *path[MAXH];
    uint32_t pidx[MAXH];
    leaf_t *l = tree_descend(ns, t, path, pidx);
    tree_insert_at(idx, ns, path, pidx, l, leaf_pos(idx, l, t, 0), ref);
}

/* The last leaf of a non-empty tree, with the path to it. */
static leaf_t *tree_rightmost(const ns_t *ns, inner_t **path, uint32_t *pidx)
{
    void *node = ns->root;
    for (uint32_t d = 0; d < ns->height; d++) {
        inner_t *in = node;
        path[d] = in;
        pidx[d] = in->n - 1;
        node = in->child[in->n - 1];
    }
    return node;
}

/* 1 if t is greater than every key of the tree (or it is empty): then
 * tree_append inserts it with no descent, and it is known to be absent.
 * Sorted input, such as a snapshot being restored, takes that path for
 * every key: one comparison instead of a search and a descent. */
int ix_tree_after_last(const kvidx_index_t *idx, const ns_t *ns, const tkey_t *t)
{
    if (!ns->root)
        return 1;
    const void *node = ns->root;
    for (uint32_t d = 0; d < ns->height; d++) {
        const inner_t *in = node;
        node = in->child[in->n - 1];
    }
    const leaf_t *l = node;
    return tk_cmp_rec(t, rec_at(idx, l->refs[l->n - 1])) > 0;
}

/* Inserts ref as the new last key; tree_after_last must have said so and
 * tree_prepare must have succeeded. */
void ix_tree_append(kvidx_index_t *idx, ns_t *ns, kvidx_ref_t ref)
{
    if (!ns->root) {
        tree_start(idx, ns, ref);
        return;
    }
    inner_t *path[MAXH];
    uint32_t pidx[MAXH];
    leaf_t *l = tree_rightmost(ns, path, pidx);
    tree_insert_at(idx, ns, path, pidx, l, l->n, ref);
}

/* Removes ref (key t) from the tree. Empty nodes are freed and a root with
 * one child collapses; there is no other rebalancing. Never allocates. */
void ix_tree_remove(kvidx_index_t *idx, ns_t *ns, const tkey_t *t, kvidx_ref_t ref)
{
    inner_t *path[MAXH];
    uint32_t pidx[MAXH];
    leaf_t *l = tree_descend(ns, t, path, pidx);
    uint32_t pos = leaf_pos(idx, l, t, 0);
    (void)ref; /* keys are unique: the ref at pos is this one */
    memmove(&l->refs[pos], &l->refs[pos + 1], (l->n - pos - 1) * sizeof(uint32_t));
    l->n--;
    if (l->n)
        return;
    if (l->prev)
        l->prev->next = l->next;
    else
        ns->first = l->next;
    if (l->next)
        l->next->prev = l->prev;
    kvidx_free(l);
    int d = (int)ns->height - 1;
    for (; d >= 0; d--) {
        inner_t *in = path[d];
        uint32_t i = pidx[d];
        /* Drop child i and the separator on its left (sep[0] for child 0). */
        uint32_t s = i ? i - 1 : 0;
        if (in->n >= 2)
            memmove(&in->sep[s], &in->sep[s + 1], (in->n - 2 - s) * sizeof(skey_t));
        memmove(&in->child[i], &in->child[i + 1], (in->n - 1 - i) * sizeof(void *));
        in->n--;
        if (in->n)
            break;
        kvidx_free(in);
    }
    if (d < 0) {
        ns->root = NULL;
        ns->height = 0;
        ns->first = NULL;
        return;
    }
    while (ns->height > 0 && ((inner_t *)ns->root)->n == 1) {
        inner_t *old = ns->root;
        ns->root = old->child[0];
        ns->height--;
        kvidx_free(old);
    }
}

/* Positions c at the first key > t (strict) or >= t; leaf NULL at the end. */
void ix_tree_seek(const kvidx_index_t *idx, const ns_t *ns, const tkey_t *t, int strict,
                  cursor_t *c)
{
    c->leaf = NULL;
    c->pos = 0;
    const void *node = ns->root;
    if (!node)
        return;
    for (uint32_t d = 0; d < ns->height; d++) {
        const inner_t *in = node;
        node = in->child[inner_pick(in, t)];
    }
    const leaf_t *l = node;
    uint32_t pos = leaf_pos(idx, l, t, strict);
    if (pos == l->n) {
        l = l->next;
        pos = 0;
    }
    c->leaf = l;
    c->pos = pos;
}

void ix_tree_free(void *node, uint32_t height)
{
    if (!node)
        return;
    if (height) {
        inner_t *in = node;
        for (uint32_t i = 0; i < in->n; i++)
            ix_tree_free(in->child[i], height - 1);
    }
    kvidx_free(node);
}
