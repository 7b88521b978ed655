/*
 * The prefetch table (see kvidx/prefetch_table.h): handles by id, loads by
 * (ref, generation), tasks by id and in creation order, and one binary heap
 * of the times at which something is due (a lease end, the end of a grace
 * period, a task deadline).
 *
 * Invariants, checked by tests/unit/lib/test_prefetch_table.c after every
 * step of randomized runs, with allocations failing on purpose:
 *   - every handle is in the id map and in the heap exactly once: at
 *     expires_at while live, at gone_at once ended;
 *   - h->wait_[i] is the load that key i of h waits for, and that load
 *     lists (h, i) among its waiters, exactly when the ledger marks key i
 *     waiting; an ended handle waits for nothing;
 *   - every load is in the load map and at one open position of exactly one
 *     task; every task in the maps has open > 0 loads and is in the heap;
 *   - whatever may need memory later (map buckets, heap slots) is reserved
 *     before the state changes, so an operation that fails with
 *     KVIDX_ENOMEM leaves everything as it was.
 */
#include "kvidx/prefetch_table.h"

#include "kvidx/alloc.h"
#include "kvidx/err.h"
#include "kvidx/list_query.h"

#include <stddef.h>
#include <string.h>

enum { TIMER_HANDLE = 1, TIMER_TASK = 2 };

struct waiter {
    kvidx_pft_handle_t *h;
    uint32_t i;
};

struct kvidx_pft_load {
    kvidx_pft_link_t link; /* key = ref */
    kvidx_ref_t ref;
    uint64_t gen;
    struct waiter *w;
    size_t nw, capw;
    kvidx_pft_task_t *task;
    size_t task_pos;
};

/* Chained hash map of links by uint64 key; duplicates allowed. */
struct map {
    kvidx_pft_link_t **b;
    size_t cap, n; /* cap is 0 or a power of two */
};

struct kvidx_pft {
    kvidx_index_t *idx;
    kvidx_pft_events_t ev;
    struct map handles, loads, tasks;
    kvidx_pft_task_t *task_head, *task_tail;
    kvidx_pft_timer_t **heap;
    size_t heap_n, heap_cap;
    uint64_t first_id, last_id, last_task;
    uint64_t grace_ms, load_timeout_ms;
    uint64_t counters[KVIDX_PFT_COUNTERS];
};

/* ---- maps ---- */

#define CONTAINER(p, type, member) ((type *)(void *)((char *)(p)-offsetof(type, member)))

static kvidx_pft_handle_t *handle_of(const kvidx_pft_link_t *e)
{
    return e ? CONTAINER(e, kvidx_pft_handle_t, link_) : NULL;
}

static kvidx_pft_task_t *task_of(const kvidx_pft_link_t *e)
{
    return e ? CONTAINER(e, kvidx_pft_task_t, link_) : NULL;
}

static size_t map_slot(size_t cap, uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)(key & (cap - 1));
}

/* Makes room for one more link, so that the next map_put cannot fail. */
static int map_reserve(struct map *m)
{
    if (m->cap && m->n + 1 <= m->cap / 4 * 3)
        return 0;
    size_t cap = m->cap ? m->cap * 2 : 16;
    kvidx_pft_link_t **b = kvidx_calloc(cap, sizeof(*b));
    if (!b)
        return KVIDX_ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        for (kvidx_pft_link_t *e = m->b[i], *next; e; e = next) {
            next = e->next;
            size_t s = map_slot(cap, e->key);
            e->next = b[s];
            b[s] = e;
        }
    }
    kvidx_free(m->b);
    m->b = b;
    m->cap = cap;
    return 0;
}

static void map_put(struct map *m, kvidx_pft_link_t *x)
{
    size_t s = map_slot(m->cap, x->key);
    x->next = m->b[s];
    m->b[s] = x;
    m->n++;
}

static kvidx_pft_link_t *map_first(const struct map *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    for (kvidx_pft_link_t *e = m->b[map_slot(m->cap, key)]; e; e = e->next)
        if (e->key == key)
            return e;
    return NULL;
}

static void map_del(struct map *m, kvidx_pft_link_t *x)
{
    if (!m->cap)
        return;
    for (kvidx_pft_link_t **pp = &m->b[map_slot(m->cap, x->key)]; *pp; pp = &(*pp)->next) {
        if (*pp == x) {
            *pp = x->next;
            m->n--;
            return;
        }
    }
}

/* ---- the heap of due times ---- */

static void heap_swap(kvidx_pft_t *t, size_t a, size_t b)
{
    kvidx_pft_timer_t *x = t->heap[a];
    t->heap[a] = t->heap[b];
    t->heap[b] = x;
    t->heap[a]->pos = a;
    t->heap[b]->pos = b;
}

static void heap_fix(kvidx_pft_t *t, size_t i)
{
    while (i > 0 && t->heap[(i - 1) / 2]->at > t->heap[i]->at) {
        heap_swap(t, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < t->heap_n && t->heap[l]->at < t->heap[m]->at)
            m = l;
        if (r < t->heap_n && t->heap[r]->at < t->heap[m]->at)
            m = r;
        if (m == i)
            return;
        heap_swap(t, i, m);
        i = m;
    }
}

/* Makes room for one more entry, so that the next heap_add cannot fail. */
static int heap_reserve(kvidx_pft_t *t)
{
    if (t->heap_n < t->heap_cap)
        return 0;
    size_t cap = t->heap_cap ? t->heap_cap * 2 : 16;
    kvidx_pft_timer_t **h = kvidx_realloc(t->heap, cap * sizeof(*h));
    if (!h)
        return KVIDX_ENOMEM;
    t->heap = h;
    t->heap_cap = cap;
    return 0;
}

static void heap_add(kvidx_pft_t *t, kvidx_pft_timer_t *x, uint64_t at)
{
    x->at = at;
    x->pos = t->heap_n;
    t->heap[t->heap_n++] = x;
    heap_fix(t, x->pos);
}

static void heap_move(kvidx_pft_t *t, kvidx_pft_timer_t *x, uint64_t at)
{
    x->at = at;
    heap_fix(t, x->pos);
}

static void heap_del(kvidx_pft_t *t, kvidx_pft_timer_t *x)
{
    size_t i = x->pos;
    if (i >= t->heap_n || t->heap[i] != x)
        return;
    t->heap_n--;
    if (i < t->heap_n) {
        t->heap[i] = t->heap[t->heap_n];
        t->heap[i]->pos = i;
        heap_fix(t, i);
    }
}

/* ---- events ---- */

static void count(kvidx_pft_t *t, kvidx_pft_counter_t c, uint64_t d)
{
    t->counters[c] += d;
    if (t->ev.count)
        t->ev.count(t->ev.ctx, c, d);
}

static void changed(kvidx_pft_t *t, kvidx_pft_handle_t *h)
{
    if (t->ev.changed)
        t->ev.changed(t->ev.ctx, h);
}

/* ---- table ---- */

int kvidx_pft_new(kvidx_pft_t **out, kvidx_index_t *idx, const kvidx_pft_events_t *ev,
                  uint64_t first_id)
{
    kvidx_pft_t *t = kvidx_calloc(1, sizeof(*t));
    *out = NULL;
    if (!t)
        return KVIDX_ENOMEM;
    t->idx = idx;
    if (ev)
        t->ev = *ev;
    t->first_id = t->last_id = first_id;
    *out = t;
    return 0;
}

void kvidx_pft_set_times(kvidx_pft_t *t, uint64_t grace_ms, uint64_t load_timeout_ms)
{
    t->grace_ms = grace_ms;
    t->load_timeout_ms = load_timeout_ms;
}

static int handle_live(const kvidx_pft_handle_t *h)
{
    return h->pfh.status == KVIDX_PFH_PENDING || h->pfh.status == KVIDX_PFH_COMPLETED;
}

/* ---- loads and tasks ---- */

static struct kvidx_pft_load *load_find(const kvidx_pft_t *t, kvidx_ref_t ref, uint64_t gen)
{
    for (kvidx_pft_link_t *e = map_first(&t->loads, ref); e; e = e->next) {
        struct kvidx_pft_load *l = (struct kvidx_pft_load *)e;
        if (e->key == ref && l->gen == gen)
            return l;
    }
    return NULL;
}

static int load_add_waiter(struct kvidx_pft_load *l, kvidx_pft_handle_t *h, size_t i)
{
    if (l->nw == l->capw) {
        size_t cap = l->capw ? l->capw * 2 : 2;
        struct waiter *w = kvidx_realloc(l->w, cap * sizeof(*w));
        if (!w)
            return KVIDX_ENOMEM;
        l->w = w;
        l->capw = cap;
    }
    l->w[l->nw].h = h;
    l->w[l->nw].i = (uint32_t)i;
    l->nw++;
    h->wait_[i] = l;
    return 0;
}

/* h stops waiting for its loads (they go on for the others). */
static void handle_detach(kvidx_pft_handle_t *h)
{
    for (size_t i = 0; i < h->pfh.n; i++) {
        struct kvidx_pft_load *l = h->wait_[i];
        if (!l)
            continue;
        for (size_t j = 0; j < l->nw; j++) {
            if (l->w[j].h == h && l->w[j].i == i) {
                l->w[j] = l->w[--l->nw];
                break;
            }
        }
        h->wait_[i] = NULL;
    }
}

static void task_remove(kvidx_pft_t *t, kvidx_pft_task_t *task)
{
    map_del(&t->tasks, &task->link_);
    heap_del(t, &task->timer_);
    if (task->prev_)
        task->prev_->next_ = task->next_;
    else if (t->task_head == task)
        t->task_head = task->next_;
    if (task->next_)
        task->next_->prev_ = task->prev_;
    else if (t->task_tail == task)
        t->task_tail = task->prev_;
    kvidx_free(task->loads_);
    kvidx_free(task);
}

/* A task of room for cap loads, in the maps but not yet in the heap (its
 * heap slot is reserved). */
static kvidx_pft_task_t *task_new(kvidx_pft_t *t, size_t cap, uint64_t wall_ms)
{
    kvidx_pft_task_t *task = kvidx_calloc(1, sizeof(*task));
    if (task)
        task->loads_ = kvidx_calloc(cap ? cap : 1, sizeof(*task->loads_));
    if (!task || !task->loads_ || map_reserve(&t->tasks) != 0 || heap_reserve(t) != 0) {
        if (task)
            kvidx_free(task->loads_);
        kvidx_free(task);
        return NULL;
    }
    task->id = ++t->last_task;
    task->link_.key = task->id;
    task->timer_.kind = TIMER_TASK;
    task->timer_.pos = SIZE_MAX;
    task->created_wall_ms = wall_ms;
    map_put(&t->tasks, &task->link_);
    task->prev_ = t->task_tail;
    if (t->task_tail)
        t->task_tail->next_ = task;
    else
        t->task_head = task;
    t->task_tail = task;
    return task;
}

static void handle_complete(kvidx_pft_t *t, kvidx_pft_handle_t *h)
{
    /* On KVIDX_ENOMEM the ledger completes without a result, holding nothing. */
    (void)kvidx_pfh_complete(&h->pfh, t->idx);
    changed(t, h);
}

/* Ends load l: ok says whether the loader put the bytes in L1. Every waiter
 * pins before the copy turns ready (kvidx_pfh_load_result), so nothing can
 * evict it in between; handles complete after the copy is ready. */
static void load_finish(kvidx_pft_t *t, struct kvidx_pft_load *l, int ok)
{
    kvidx_entry_info_t info;
    int mine = kvidx_index_info(t->idx, l->ref, &info) == 0 && info.l1_state == KVIDX_L1_LOADING &&
               info.generation == l->gen;
    if (!mine)
        ok = 0; /* the copy was force-deleted while loading */
    int warm = 0;
    for (size_t j = 0; j < l->nw; j++)
        warm |= l->w[j].h->pfh.mode == KVIDX_PF_WARM;
    if (ok && warm)
        kvidx_index_set_temporary(t->idx, l->ref, 0); /* what WARM loads stays */
    for (size_t j = 0; j < l->nw; j++) {
        kvidx_pft_handle_t *h = l->w[j].h;
        h->wait_[l->w[j].i] = NULL;
        kvidx_pfh_load_result(&h->pfh, t->idx, l->w[j].i, l->gen, ok);
    }
    if (mine)
        kvidx_index_l1_load_done(t->idx, l->ref, l->gen, ok && l->nw > 0);
    count(t, ok ? KVIDX_PFT_LOADS_COMPLETED : KVIDX_PFT_LOAD_FAILURES, 1);
    map_del(&t->loads, &l->link);
    kvidx_pft_task_t *task = l->task;
    task->loads_[l->task_pos] = NULL;
    if (--task->open == 0)
        task_remove(t, task);
    /* A handle may be listed twice (a key given twice): the status check
     * completes it once. */
    for (size_t j = 0; j < l->nw; j++) {
        kvidx_pft_handle_t *h = l->w[j].h;
        if (h->pfh.status == KVIDX_PFH_PENDING && h->pfh.waiting == 0)
            handle_complete(t, h);
    }
    kvidx_free(l->w);
    kvidx_free(l);
}

/* A new load of key i of h on the copy (ref, gen) just reserved, in *task
 * (made on first use with room for cap loads). 0, or KVIDX_ENOMEM with
 * nothing recorded. */
static int load_new(kvidx_pft_t *t, kvidx_pft_handle_t *h, size_t i, uint64_t gen,
                    kvidx_pft_task_t **task, size_t cap, uint64_t wall_ms)
{
    struct kvidx_pft_load *l = kvidx_calloc(1, sizeof(*l));
    if (!l || map_reserve(&t->loads) != 0)
        goto fail;
    if (!*task && !(*task = task_new(t, cap, wall_ms)))
        goto fail;
    l->ref = h->pfh.keys[i].ref;
    l->gen = gen;
    l->link.key = l->ref;
    if (load_add_waiter(l, h, i) != 0)
        goto fail;
    map_put(&t->loads, &l->link);
    l->task = *task;
    l->task_pos = (*task)->n;
    (*task)->loads_[(*task)->n++] = l;
    (*task)->open++;
    return 0;
fail:
    if (l)
        kvidx_free(l->w);
    kvidx_free(l);
    h->wait_[i] = NULL;
    return KVIDX_ENOMEM;
}

/* Starts (or joins) the load of planned L2 key i of h. A key that cannot
 * be loaded is marked failed by the ledger; nothing here completes h. */
static void start_or_join(kvidx_pft_t *t, kvidx_pft_handle_t *h, size_t i, int temporary,
                          kvidx_pft_task_t **task, size_t cap, uint64_t wall_ms)
{
    uint64_t gen = 0;
    kvidx_ref_t ref = h->pfh.keys[i].ref;
    switch (kvidx_pfh_start_load(&h->pfh, t->idx, i, temporary, &gen)) {
    case KVIDX_PFH_LOAD_READY:
        return;
    case KVIDX_PFH_LOAD_FAILED:
        count(t, KVIDX_PFT_LOAD_FAILURES, 1); /* no room even after eviction */
        return;
    case KVIDX_PFH_LOAD_JOIN: {
        /* In flight already (perhaps started by this very submit for a key
         * given twice): wait for that load. */
        struct kvidx_pft_load *l = load_find(t, ref, gen);
        if (!l || load_add_waiter(l, h, i) != 0)
            kvidx_pfh_load_result(&h->pfh, t->idx, i, gen, 0);
        return;
    }
    case KVIDX_PFH_LOAD_NEW:
        break;
    }
    if (load_new(t, h, i, gen, task, cap, wall_ms) != 0) {
        /* The load failed before it started: drop the reservation. */
        kvidx_pfh_load_result(&h->pfh, t->idx, i, gen, 0);
        kvidx_index_l1_load_done(t->idx, ref, gen, 0);
        count(t, KVIDX_PFT_LOAD_FAILURES, 1);
        return;
    }
    count(t, KVIDX_PFT_LOADS, 1);
}

/* ---- handles ---- */

static void handle_free(kvidx_pft_t *t, kvidx_pft_handle_t *h)
{
    kvidx_pfh_close(&h->pfh, t->idx);
    kvidx_free(h->wait_);
    kvidx_free(h->ext_id);
    kvidx_free(h->owner);
    kvidx_free(h);
}

/* Live → released or expired at time now: every pin goes back, the grace
 * period starts. */
static void handle_end(kvidx_pft_t *t, kvidx_pft_handle_t *h, kvidx_pfh_status_t st, uint64_t now)
{
    handle_detach(h);
    kvidx_pfh_end(&h->pfh, t->idx, st);
    h->gone_at = now + t->grace_ms;
    heap_move(t, &h->timer_, h->gone_at);
    changed(t, h);
}

static void handle_forget(kvidx_pft_t *t, kvidx_pft_handle_t *h)
{
    handle_detach(h);
    if (t->ev.gone)
        t->ev.gone(t->ev.ctx, h);
    map_del(&t->handles, &h->link_);
    heap_del(t, &h->timer_);
    handle_free(t, h);
}

static char *str_dup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = kvidx_malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* A handle with its ledger open, not yet in the table (its map and heap
 * slots are reserved). 0, KVIDX_EINVAL or KVIDX_ENOMEM. */
static int handle_new(kvidx_pft_t *t, const kvidx_pft_submit_t *s, kvidx_pft_handle_t **out)
{
    kvidx_pft_handle_t *h = kvidx_calloc(1, sizeof(*h));
    int rc = h ? 0 : KVIDX_ENOMEM;
    if (rc == 0) {
        h->wait_ = kvidx_calloc(s->n ? s->n : 1, sizeof(*h->wait_));
        h->ext_id = s->ext_id ? str_dup(s->ext_id) : NULL;
        h->owner = s->owner ? str_dup(s->owner) : NULL;
        if (!h->wait_ || (s->ext_id && !h->ext_id) || (s->owner && !h->owner) ||
            map_reserve(&t->handles) != 0 || heap_reserve(t) != 0)
            rc = KVIDX_ENOMEM;
    }
    if (rc == 0)
        rc = kvidx_pfh_open(&h->pfh, t->idx, s->keys, s->n, s->mode, s->policy, s->extra, s->ipc);
    if (rc != 0) {
        if (h) {
            kvidx_free(h->wait_);
            kvidx_free(h->ext_id);
            kvidx_free(h->owner);
        }
        kvidx_free(h);
        return rc;
    }
    h->is_ipc = s->ipc != NULL;
    h->submit_wall_ms = s->submit_wall_ms;
    h->timer_.kind = TIMER_HANDLE;
    *out = h;
    return 0;
}

/* WARM's planned hits: a temporary copy (loaded for some LOOKUP reader)
 * becomes permanent, or that reader's last unpin would drop what WARM
 * reports resident. While WARM's own reservations evict, each hit holds a
 * pin of its own (a temporary unpinned copy is left alone: its last unpin
 * would drop it), recorded in guard (n_l1_hits zeroed bytes, taken by the
 * caller before anything changed; NULL when WARM has no hit or no load). */
static void warm_guard(kvidx_pft_t *t, kvidx_pft_handle_t *h, uint8_t *guard)
{
    const kvidx_prefetch_plan_t *plan = &h->pfh.plan;
    if (h->pfh.mode != KVIDX_PF_WARM)
        return;
    for (size_t j = 0; j < plan->n_l1_hits; j++)
        kvidx_index_set_temporary(t->idx, h->pfh.keys[plan->l1_hits[j]].ref, 0);
    for (size_t j = 0; guard && j < plan->n_l1_hits; j++) {
        const kvidx_pfh_key_t *k = &h->pfh.keys[plan->l1_hits[j]];
        kvidx_entry_info_t info;
        if (kvidx_index_info(t->idx, k->ref, &info) == 0 && !(info.temporary && info.pins == 0))
            guard[j] = kvidx_index_pin(t->idx, k->ref, k->gen, 1) == 0;
    }
}

static void warm_unguard(kvidx_pft_t *t, kvidx_pft_handle_t *h, uint8_t *guard)
{
    const kvidx_prefetch_plan_t *plan = &h->pfh.plan;
    for (size_t j = 0; guard && j < plan->n_l1_hits; j++) {
        const kvidx_pfh_key_t *k = &h->pfh.keys[plan->l1_hits[j]];
        if (guard[j])
            kvidx_index_unpin(t->idx, k->ref, k->gen, 1);
    }
    kvidx_free(guard);
}

int kvidx_pft_submit(kvidx_pft_t *t, const kvidx_pft_submit_t *s, uint64_t now,
                     kvidx_pft_handle_t **out, uint64_t *task_id)
{
    kvidx_pft_handle_t *h = NULL;
    *out = NULL;
    *task_id = 0;
    int rc = handle_new(t, s, &h);
    if (rc != 0)
        return rc;
    const kvidx_prefetch_plan_t *plan = &h->pfh.plan;
    uint8_t *guard = NULL;
    if (h->pfh.mode == KVIDX_PF_WARM && plan->n_l1_hits && plan->n_l2_orig &&
        !(guard = kvidx_calloc(plan->n_l1_hits, 1))) {
        handle_free(t, h);
        return KVIDX_ENOMEM;
    }
    h->id = ++t->last_id;
    h->link_.key = h->id;
    map_put(&t->handles, &h->link_);
    h->expires_at = now + s->lease_ms;
    heap_add(t, &h->timer_, h->expires_at);
    count(t, KVIDX_PFT_PREFETCHES, 1);

    int temporary = s->temporary && h->pfh.mode == KVIDX_PF_LOOKUP;
    warm_guard(t, h, guard);
    /* No load can finish before this returns: h cannot complete in between. */
    kvidx_pft_task_t *task = NULL;
    for (size_t j = 0; j < plan->n_l2_orig; j++)
        start_or_join(t, h, plan->l2_orig[j], temporary, &task, plan->n_l2_orig, s->submit_wall_ms);
    warm_unguard(t, h, guard);
    if (task && task->open == 0) {
        task_remove(t, task);
    } else if (task) {
        task->deadline = now + t->load_timeout_ms;
        heap_add(t, &task->timer_, task->deadline);
        *task_id = task->id;
    }
    if (h->pfh.status == KVIDX_PFH_PENDING && h->pfh.waiting == 0)
        handle_complete(t, h);
    *out = h;
    return 0;
}

int kvidx_pft_find(const kvidx_pft_t *t, uint64_t id, kvidx_pft_handle_t **out)
{
    kvidx_pft_handle_t *h = handle_of(map_first(&t->handles, id));
    *out = h;
    if (!h)
        return KVIDX_ENOTFOUND;
    return h->pfh.status == KVIDX_PFH_EXPIRED ? KVIDX_EHANDLEEXPIRED : 0;
}

int kvidx_pft_delete(kvidx_pft_t *t, uint64_t id, uint64_t now)
{
    if (id == 0 || id > t->last_id)
        return KVIDX_ENOTFOUND;
    kvidx_pft_handle_t *h = handle_of(map_first(&t->handles, id));
    if (h && handle_live(h))
        handle_end(t, h, KVIDX_PFH_RELEASED, now);
    return 0;
}

int kvidx_pft_release(kvidx_pft_t *t, kvidx_pft_handle_t *h, uint64_t now, const uint32_t *indices,
                      size_t n, size_t *bad)
{
    int rc = kvidx_pfh_release(&h->pfh, t->idx, indices, n, bad);
    if (rc == 0 && h->pfh.status == KVIDX_PFH_RELEASED) {
        /* The ledger is released already: only the table's part remains. */
        handle_detach(h);
        h->gone_at = now + t->grace_ms;
        heap_move(t, &h->timer_, h->gone_at);
        changed(t, h);
    }
    return rc;
}

int kvidx_pft_extend(kvidx_pft_t *t, kvidx_pft_handle_t *h, uint64_t now, uint64_t lease_ms)
{
    if (h->pfh.status == KVIDX_PFH_RELEASED)
        return KVIDX_ECONFLICT;
    if (h->pfh.status == KVIDX_PFH_EXPIRED)
        return KVIDX_EHANDLEEXPIRED;
    h->expires_at = now + lease_ms;
    heap_move(t, &h->timer_, h->expires_at);
    return 0;
}

void kvidx_pft_refresh(const kvidx_pft_t *t, kvidx_pft_handle_t *h)
{
    kvidx_pfh_refresh(&h->pfh, t->idx);
}

int kvidx_pft_next_deadline(const kvidx_pft_t *t, uint64_t *at)
{
    if (!t->heap_n)
        return KVIDX_ENOTFOUND;
    *at = t->heap[0]->at;
    return 0;
}

/* Fails every open load of task (which is then gone). */
static void task_fail(kvidx_pft_t *t, kvidx_pft_task_t *task)
{
    size_t n = task->n;
    struct kvidx_pft_load **loads = task->loads_;
    /* The last load frees the task: stop there. */
    for (size_t i = 0, open = task->open; i < n && open > 0; i++) {
        if (loads[i]) {
            open--;
            load_finish(t, loads[i], 0);
        }
    }
}

void kvidx_pft_advance(kvidx_pft_t *t, uint64_t now)
{
    while (t->heap_n && t->heap[0]->at <= now) {
        kvidx_pft_timer_t *x = t->heap[0];
        if (x->kind == TIMER_TASK) {
            task_fail(t, CONTAINER(x, kvidx_pft_task_t, timer_));
            continue;
        }
        kvidx_pft_handle_t *h = CONTAINER(x, kvidx_pft_handle_t, timer_);
        if (handle_live(h)) {
            count(t, KVIDX_PFT_EXPIRATIONS, 1);
            handle_end(t, h, KVIDX_PFH_EXPIRED, now);
        } else {
            handle_forget(t, h);
        }
    }
}

void kvidx_pft_shutdown(kvidx_pft_t *t)
{
    if (!t)
        return;
    while (t->task_head)
        task_fail(t, t->task_head);
    for (size_t b = 0; b < t->handles.cap; b++) {
        while (t->handles.b[b]) {
            kvidx_pft_handle_t *h = handle_of(t->handles.b[b]);
            if (handle_live(h)) {
                handle_detach(h);
                kvidx_pfh_end(&h->pfh, t->idx, KVIDX_PFH_RELEASED);
            }
            handle_forget(t, h);
        }
    }
}

void kvidx_pft_free(kvidx_pft_t *t)
{
    if (!t)
        return;
    kvidx_pft_shutdown(t);
    kvidx_free(t->handles.b);
    kvidx_free(t->loads.b);
    kvidx_free(t->tasks.b);
    kvidx_free(t->heap);
    kvidx_free(t);
}

/* ---- tasks ---- */

const kvidx_pft_task_t *kvidx_pft_task_first(const kvidx_pft_t *t)
{
    return t->task_head;
}

const kvidx_pft_task_t *kvidx_pft_task_next(const kvidx_pft_task_t *task)
{
    return task->next_;
}

const kvidx_pft_task_t *kvidx_pft_task_find(const kvidx_pft_t *t, uint64_t id)
{
    return task_of(map_first(&t->tasks, id));
}

int kvidx_pft_task_ref(const kvidx_pft_task_t *task, size_t pos, kvidx_ref_t *ref)
{
    if (pos >= task->n || !task->loads_[pos])
        return KVIDX_ENOTFOUND;
    *ref = task->loads_[pos]->ref;
    return 0;
}

int kvidx_pft_task_finish(kvidx_pft_t *t, uint64_t task_id, size_t pos, int ok)
{
    kvidx_pft_task_t *task = task_of(map_first(&t->tasks, task_id));
    if (!task || pos >= task->n || !task->loads_[pos])
        return KVIDX_ENOTFOUND;
    load_finish(t, task->loads_[pos], ok);
    return 0;
}

/* ---- figures ---- */

void kvidx_pft_each(const kvidx_pft_t *t, void (*fn)(void *ctx, const kvidx_pft_handle_t *h),
                    void *ctx)
{
    for (size_t b = 0; b < t->handles.cap; b++)
        for (const kvidx_pft_link_t *e = t->handles.b[b]; e; e = e->next)
            fn(ctx, handle_of(e));
}

static void stats_add(void *ctx, const kvidx_pft_handle_t *h)
{
    kvidx_pft_stats_t *out = ctx;
    out->handles_pending += h->pfh.status == KVIDX_PFH_PENDING;
    out->pins += h->pfh.pins;
}

void kvidx_pft_stats(const kvidx_pft_t *t, kvidx_pft_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    out->handles = t->handles.n;
    kvidx_pft_each(t, stats_add, out);
    out->loads = t->loads.n;
    out->tasks = t->tasks.n;
    memcpy(out->counters, t->counters, sizeof(out->counters));
}

/* ---- wire forms ---- */

int kvidx_pft_parse_id(const char *s, size_t n, uint64_t *id, size_t *used)
{
    uint64_t v = 0;
    size_t i = 0;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return KVIDX_EINVAL;
        v = v * 10 + d;
    }
    if (i == 0 || (s[0] == '0' && i > 1))
        return KVIDX_EINVAL;
    *id = v;
    if (used)
        *used = i;
    return 0;
}

static int wait_fail(kvidx_reason_t *why, const char *field, const char *rule)
{
    if (why) {
        why->field = field;
        why->rule = rule;
    }
    return KVIDX_EINVAL;
}

/* The decimal value of wait_ms: 1..5 digits, at most KVIDX_PFT_WAIT_MS_MAX. */
static int wait_value(const char *v, size_t vn, uint64_t *ms)
{
    char buf[8];
    size_t n = 0;
    if (kvidx_pct_decode(v, vn, buf, sizeof(buf), &n, 1) != 0 || n == 0)
        return KVIDX_EINVAL;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (buf[i] < '0' || buf[i] > '9')
            return KVIDX_EINVAL;
        x = x * 10 + (uint64_t)(buf[i] - '0');
    }
    if (x > KVIDX_PFT_WAIT_MS_MAX)
        return KVIDX_EINVAL;
    *ms = x;
    return 0;
}

int kvidx_pft_parse_wait(const char *qs, size_t n, int *given, uint64_t *ms, kvidx_reason_t *why)
{
    *given = 0;
    *ms = 0;
    size_t pos = 0;
    kvidx_query_pair_t qp;
    while (kvidx_query_next(qs, n, &pos, &qp)) {
        char name[8];
        size_t nl = 0;
        if (kvidx_pct_decode(qp.name, qp.name_len, name, sizeof(name), &nl, 1) != 0 || nl != 7 ||
            memcmp(name, "wait_ms", 7) != 0)
            return wait_fail(why, "query", "unknown parameter (known: wait_ms)");
        if (*given)
            return wait_fail(why, "wait_ms", "must not be given more than once");
        if (wait_value(qp.value, qp.value_len, ms) != 0)
            return wait_fail(why, "wait_ms", "must be an integer 0..30000");
        *given = 1;
    }
    return 0;
}
