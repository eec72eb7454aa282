/*
 * pld_corpus.c -- a bounded set of token sequences with a lookup whose
 * cost does not grow with it (see pld.h, "Corpus", for the contract).
 *
 * Layout: a ring of at most max_segments segments, the oldest at `head`.
 * A segment is a RECENT pld_index over its sequences, each followed by the
 * separator -1, with the start of each sequence in that index. Dropping
 * the oldest segment frees one index: eviction costs nothing per token.
 *
 * A lookup asks each segment for the newest per_ngram occurrences of each
 * suffix n-gram (pld_index_continuations_many: one probe, then the chain
 * of earlier occurrences), so its work is bounded by segments x sizes x
 * per_ngram continuations, however many tokens are held. Those probes are
 * independent, so they go as one batch whose cache misses overlap: in a
 * corpus larger than the caches nearly every read is a miss.
 */
#include "pld.h"
#include "pld_internal.h"

#include <stdlib.h>
#include <string.h>

#define PLD_SEPARATOR ((int64_t)-1)

typedef struct {
    pld_index *index;  /* its sequences, each followed by PLD_SEPARATOR */
    uint32_t *starts;  /* where each sequence begins in the index (n_seqs used) */
    size_t n_seqs, cap_seqs;
    size_t tokens;     /* its sequences' tokens, separators not counted */
    int64_t max_id;    /* the largest id in it; -1: none */
} pld_segment;

struct pld_corpus {
    size_t max_tokens, min_n, max_n, max_segments;
    size_t target;     /* T = ceil(max_tokens / max_segments): a segment this full is closed */
    uint64_t key;
    pld_segment seg[PLD_CORPUS_MAX_SEGMENTS]; /* seg[(head + j) % max_segments], j < used,
                                               * oldest first */
    size_t head, used;
    size_t tokens, sequences; /* held, over all segments */
    uint64_t evicted;
};

/* The slot of the j-th segment in use, oldest first. */
static inline size_t ring(const pld_corpus *c, size_t j)
{
    return (c->head + j) % c->max_segments;
}

static void segment_free(pld_segment *s)
{
    pld_index_free(s->index);
    free(s->starts);
    memset(s, 0, sizeof(*s));
    s->max_id = -1;
}

/* Append one valid sequence (len >= 1) and its separator. All or nothing. */
static pld_status segment_append(pld_segment *s, const int64_t *tokens, size_t len)
{
    const int64_t sep = PLD_SEPARATOR;
    const size_t old = pld_index_len(s->index);
    pld_status st;
    size_t i;
    if (s->n_seqs == s->cap_seqs) {
        const size_t cap = s->cap_seqs ? 2 * s->cap_seqs : 16;
        uint32_t *starts = realloc(s->starts, cap * sizeof(uint32_t));
        if (starts == NULL)
            return PLD_ERR_NOMEM;
        s->starts = starts;
        s->cap_seqs = cap;
    }
    st = pld_index_extend(s->index, tokens, len);
    if (st == PLD_OK)
        st = pld_index_extend(s->index, &sep, 1);
    if (st != PLD_OK) {
        (void)pld_index_truncate(s->index, old); /* RECENT: cannot fail */
        return st;
    }
    s->starts[s->n_seqs++] = (uint32_t)old; /* < 2 * PLD_CORPUS_MAX_TOKENS: fits */
    s->tokens += len;
    for (i = 0; i < len; i++)
        if (tokens[i] > s->max_id)
            s->max_id = tokens[i];
    return PLD_OK;
}

/* A segment no sequence will join any more: its arrays to its size. */
static void segment_seal(pld_segment *s)
{
    pld_index_shrink_to_fit(s->index);
    if (s->n_seqs > 0 && s->n_seqs < s->cap_seqs) {
        uint32_t *starts = realloc(s->starts, s->n_seqs * sizeof(uint32_t));
        if (starts != NULL) {
            s->starts = starts;
            s->cap_seqs = s->n_seqs;
        }
    }
}

/* Drop the oldest segment (used > 0). */
static void drop_oldest(pld_corpus *c)
{
    pld_segment *s = &c->seg[c->head];
    c->tokens -= s->tokens;
    c->sequences -= s->n_seqs;
    c->evicted += s->n_seqs;
    segment_free(s);
    c->head = (c->head + 1) % c->max_segments;
    c->used--;
}

pld_corpus *pld_corpus_new(size_t max_tokens, size_t min_n, size_t max_n, size_t segments,
                           uint64_t key)
{
    pld_corpus *c;
    size_t j;
    if (min_n < 1 || min_n > max_n || max_n > PLD_MAX_NGRAM || segments < 1 ||
        segments > PLD_CORPUS_MAX_SEGMENTS || max_tokens < 1 || max_tokens > PLD_CORPUS_MAX_TOKENS)
        return NULL;
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->max_tokens = max_tokens;
    c->min_n = min_n;
    c->max_n = max_n;
    c->max_segments = segments;
    c->target = max_tokens / segments + (max_tokens % segments != 0);
    c->key = key;
    for (j = 0; j < PLD_CORPUS_MAX_SEGMENTS; j++)
        c->seg[j].max_id = -1;
    return c;
}

void pld_corpus_free(pld_corpus *c)
{
    if (c == NULL)
        return;
    pld_corpus_clear(c);
    free(c);
}

void pld_corpus_clear(pld_corpus *c)
{
    size_t j;
    if (c == NULL)
        return;
    for (j = 0; j < c->used; j++)
        segment_free(&c->seg[ring(c, j)]);
    c->head = c->used = 0;
    c->tokens = c->sequences = 0;
}

pld_status pld_corpus_add(pld_corpus *c, const int64_t *tokens, size_t len)
{
    pld_segment *newest;
    pld_status st;
    size_t i;
    if (c == NULL || (tokens == NULL && len > 0) || len > c->max_tokens)
        return PLD_ERR_ARG;
    for (i = 0; i < len; i++)
        if (tokens[i] < 0)
            return PLD_ERR_ARG;
    if (len == 0)
        return PLD_OK;
    newest = c->used > 0 ? &c->seg[ring(c, c->used - 1)] : NULL;
    if (newest != NULL && newest->tokens < c->target && newest->tokens + len <= c->max_tokens) {
        st = segment_append(newest, tokens, len);
        if (st != PLD_OK)
            return st;
    } else {
        pld_segment fresh;
        memset(&fresh, 0, sizeof(fresh));
        fresh.max_id = -1;
        fresh.index = pld_index_new_keyed(c->min_n, c->max_n, PLD_POLICY_RECENT, c->key);
        if (fresh.index == NULL)
            return PLD_ERR_NOMEM;
        st = segment_append(&fresh, tokens, len);
        if (st != PLD_OK) {
            segment_free(&fresh);
            return st;
        }
        /* nothing can fail from here on */
        if (newest != NULL)
            segment_seal(newest);
        if (c->used == c->max_segments)
            drop_oldest(c);
        c->seg[ring(c, c->used)] = fresh;
        c->used++;
    }
    c->tokens += len;
    c->sequences++;
    while (c->tokens > c->max_tokens && c->used > 1)
        drop_oldest(c);
    return PLD_OK;
}

/* Insert the candidates of probes[0..count) (found by n-grams of the
 * context, in pld_corpus_propose_tree's order) into the trie. top: the
 * longest n looked up. */
static void insert_candidates(pld_trie *trie, const pld_probe *probes, size_t count,
                              const int64_t *context, size_t clen, size_t top, size_t depth)
{
    size_t i, f;
    for (i = 0; i < count; i++) {
        const pld_probe *p = &probes[i];
        const size_t n = p->n;
        const int64_t *t = pld_index_tokens(p->index);
        const size_t len = pld_index_len(p->index);
        for (f = 0; f < p->found; f++) {
            const size_t start = p->starts[f];
            const size_t room = len - start < depth ? len - start : depth;
            size_t count_tokens = 0;
            /* taken by a longer n (see pld_index_propose_tree_after) */
            if (n < top && start >= n + 1 && t[start - n - 1] == context[clen - n - 1])
                continue;
            while (count_tokens < room && t[start + count_tokens] >= 0)
                count_tokens++; /* up to the separator */
            pld_trie_insert(trie, t + start, count_tokens, (uint32_t)n);
        }
    }
}

pld_status pld_corpus_propose_tree(const pld_corpus *c, const int64_t *context, size_t clen,
                                   size_t depth, size_t per_ngram, size_t max_nodes,
                                   const int64_t *eos, size_t n_eos, pld_tree_node *out,
                                   size_t *n_nodes)
{
    pld_probe probes[PLD_PROBE_BATCH];
    size_t top = 0, n, j, batch = 0;
    pld_trie trie;
    if (n_nodes != NULL)
        *n_nodes = 0;
    if (c == NULL || n_nodes == NULL || (context == NULL && clen > 0) || depth < 1 ||
        per_ngram < 1 || per_ngram > PLD_TREE_MAX_PER_NGRAM || max_nodes > PLD_TREE_MAX_NODES ||
        (out == NULL && max_nodes > 0) || (eos == NULL && n_eos > 0))
        return PLD_ERR_ARG;
    (void)pld_trie_open(&trie, out, 0, max_nodes, eos, n_eos);
    /* the longest n-gram to look up: no negative id (no separator) in it */
    while (top < c->max_n && top < clen && context[clen - 1 - top] >= 0)
        top++;
    /* the probes in candidate order (n down, segments newest first), a
     * batch at a time so that their cache misses overlap */
    for (n = top; n >= c->min_n && n >= 1; n--) {
        for (j = c->used; j-- > 0;) {
            pld_probe *p = &probes[batch++];
            p->index = c->seg[ring(c, j)].index;
            p->key = context + (clen - n);
            p->n = n;
            if (batch == PLD_PROBE_BATCH) {
                pld_index_continuations_many(probes, batch, per_ngram);
                insert_candidates(&trie, probes, batch, context, clen, top, depth);
                batch = 0;
            }
        }
    }
    pld_index_continuations_many(probes, batch, per_ngram);
    insert_candidates(&trie, probes, batch, context, clen, top, depth);
    *n_nodes = trie.n_nodes;
    return PLD_OK;
}

pld_status pld_corpus_sequence(const pld_corpus *c, size_t i, const int64_t **tokens,
                               size_t *len)
{
    size_t j;
    if (tokens != NULL)
        *tokens = NULL;
    if (len != NULL)
        *len = 0;
    if (c == NULL || tokens == NULL || len == NULL || i >= c->sequences)
        return PLD_ERR_ARG;
    for (j = 0; j < c->used; j++) {
        const pld_segment *s = &c->seg[ring(c, j)];
        size_t end;
        if (i >= s->n_seqs) {
            i -= s->n_seqs;
            continue;
        }
        end = i + 1 < s->n_seqs ? s->starts[i + 1] : pld_index_len(s->index);
        *tokens = pld_index_tokens(s->index) + s->starts[i];
        *len = end - 1 - s->starts[i]; /* the separator not included */
        return PLD_OK;
    }
    return PLD_ERR_ARG; /* not reached: the counts agree */
}

size_t pld_corpus_tokens(const pld_corpus *c) { return c->tokens; }
size_t pld_corpus_sequences(const pld_corpus *c) { return c->sequences; }
uint64_t pld_corpus_evicted(const pld_corpus *c) { return c->evicted; }
size_t pld_corpus_segments_used(const pld_corpus *c) { return c->used; }
size_t pld_corpus_max_tokens(const pld_corpus *c) { return c->max_tokens; }
size_t pld_corpus_min_n(const pld_corpus *c) { return c->min_n; }
size_t pld_corpus_max_n(const pld_corpus *c) { return c->max_n; }
size_t pld_corpus_max_segments(const pld_corpus *c) { return c->max_segments; }
uint64_t pld_corpus_key(const pld_corpus *c) { return c->key; }

int64_t pld_corpus_max_id(const pld_corpus *c)
{
    int64_t top = -1;
    size_t j;
    for (j = 0; j < c->used; j++)
        if (c->seg[ring(c, j)].max_id > top)
            top = c->seg[ring(c, j)].max_id;
    return top;
}

size_t pld_corpus_nbytes(const pld_corpus *c)
{
    size_t total = sizeof(*c), j;
    for (j = 0; j < c->used; j++) {
        const pld_segment *s = &c->seg[ring(c, j)];
        total += pld_index_nbytes(s->index) + s->cap_seqs * sizeof(uint32_t);
    }
    return total;
}
