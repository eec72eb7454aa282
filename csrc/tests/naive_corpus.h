/*
 * naive_corpus.h -- brute-force references for pld_index_propose_tree_after
 * and pld_corpus (pld.h), shared by tests/test_corpus.c and
 * fuzz/fuzz_corpus.c. Written from the contract's text: every window is
 * compared, taken continuation starts are kept in a list, a node's child
 * is found by scanning every node. Quadratic and worse; small inputs only.
 */
#ifndef PLD_NAIVE_CORPUS_H
#define PLD_NAIVE_CORPUS_H

#include "pld.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Does seq[i..i+n) equal key[0..n)? */
static inline int rc_match(const int64_t *seq, size_t i, const int64_t *key, size_t n)
{
    size_t j;
    for (j = 0; j < n; j++)
        if (seq[i + j] != key[j])
            return 0;
    return 1;
}

/* Insert cand[0..count) (cut before eos) into out[0..*count_nodes). */
static inline void rc_insert(const int64_t *cand, size_t count, size_t n, const int64_t *eos,
                             size_t n_eos, size_t max_nodes, pld_tree_node *out,
                             size_t *count_nodes)
{
    int32_t parent = -1;
    size_t j, e, v;
    for (j = 0; j < count; j++) {
        int found = -1, is_eos = 0;
        for (e = 0; e < n_eos; e++)
            is_eos |= eos[e] == cand[j];
        if (is_eos)
            return;
        for (v = 0; v < *count_nodes; v++)
            if (out[v].parent == parent && out[v].token == cand[j]) {
                found = (int)v;
                break;
            }
        if (found < 0) {
            if (*count_nodes >= max_nodes)
                return;
            found = (int)(*count_nodes)++;
            out[found].token = cand[j];
            out[found].parent = parent;
            out[found].depth = (uint32_t)(j + 1);
            out[found].ngram = (uint32_t)n;
            out[found].support = 0;
            out[found].first_child = out[found].next_sibling = -1; /* not compared */
        }
        out[found].support++;
        parent = found;
    }
}

/* The candidate starts of one n in seq[0..len): occurrences i of key with
 * i + n < len; recent: the newest per_ngram, newest first; else the
 * earliest. Returns their number; starts receives i + n. */
static inline size_t rc_candidates(const int64_t *seq, size_t len, const int64_t *key, size_t n,
                                   int recent, size_t per_ngram, size_t *starts)
{
    size_t count = 0, i;
    if (n >= len)
        return 0;
    if (recent) {
        for (i = len - n; i-- > 0 && count < per_ngram;)
            if (rc_match(seq, i, key, n))
                starts[count++] = i + n;
    } else {
        for (i = 0; i + n < len; i++)
            if (rc_match(seq, i, key, n)) {
                starts[count++] = i + n;
                break;
            }
    }
    return count;
}

/* pld_index_propose_tree_after over the sequence seq[0..len) held by an
 * index with sizes min_n..max_n (recent: policy RECENT), merging into
 * out[0..n_in); returns the total. */
static inline size_t ref_tree_after(const int64_t *seq, size_t len, size_t min_n, size_t max_n,
                                    int recent, const int64_t *context, size_t clen,
                                    size_t depth, size_t per_ngram, size_t max_nodes,
                                    const int64_t *eos, size_t n_eos, pld_tree_node *out,
                                    size_t n_in)
{
    size_t used[PLD_MAX_NGRAM * PLD_TREE_MAX_PER_NGRAM], n_used = 0, count = n_in, n;
    const size_t top = max_n < clen ? max_n : clen;
    for (n = top; n >= min_n && n >= 1; n--) {
        size_t starts[PLD_TREE_MAX_PER_NGRAM], found, c, u;
        found = rc_candidates(seq, len, context + clen - n, n, recent, per_ngram, starts);
        for (c = 0; c < found; c++) {
            int taken = 0;
            for (u = 0; u < n_used; u++)
                taken |= used[u] == starts[c];
            if (taken)
                continue;
            used[n_used++] = starts[c];
            rc_insert(seq + starts[c], len - starts[c] < depth ? len - starts[c] : depth, n, eos,
                      n_eos, max_nodes, out, &count);
        }
    }
    return count;
}

/* ------------------------------------------------------------ corpus */

#define RC_MAX_SEGMENTS PLD_CORPUS_MAX_SEGMENTS

/* The corpus as plain arrays: segments oldest first, each its tokens with
 * a -1 after every sequence. */
typedef struct {
    size_t max_tokens, min_n, max_n, max_segments, target;
    int64_t *seg[RC_MAX_SEGMENTS];
    size_t seg_len[RC_MAX_SEGMENTS], seg_tokens[RC_MAX_SEGMENTS], seg_seqs[RC_MAX_SEGMENTS];
    size_t used, tokens, sequences;
    uint64_t evicted;
} ref_corpus;

static inline void ref_corpus_init(ref_corpus *r, size_t max_tokens, size_t min_n, size_t max_n,
                                   size_t segments)
{
    memset(r, 0, sizeof(*r));
    r->max_tokens = max_tokens;
    r->min_n = min_n;
    r->max_n = max_n;
    r->max_segments = segments;
    r->target = (max_tokens + segments - 1) / segments;
}

static inline void ref_corpus_drop_oldest(ref_corpus *r)
{
    size_t j;
    r->tokens -= r->seg_tokens[0];
    r->sequences -= r->seg_seqs[0];
    r->evicted += r->seg_seqs[0];
    free(r->seg[0]);
    for (j = 1; j < r->used; j++) {
        r->seg[j - 1] = r->seg[j];
        r->seg_len[j - 1] = r->seg_len[j];
        r->seg_tokens[j - 1] = r->seg_tokens[j];
        r->seg_seqs[j - 1] = r->seg_seqs[j];
    }
    r->used--;
}

static inline void ref_corpus_clear(ref_corpus *r)
{
    size_t j;
    for (j = 0; j < r->used; j++)
        free(r->seg[j]);
    r->used = r->tokens = r->sequences = 0;
}

/* pld_corpus_add: returns 0, or -1 when the contract refuses the sequence. */
static inline int ref_corpus_add(ref_corpus *r, const int64_t *t, size_t len)
{
    size_t i, s;
    if (len > r->max_tokens)
        return -1;
    for (i = 0; i < len; i++)
        if (t[i] < 0)
            return -1;
    if (len == 0)
        return 0;
    if (r->used == 0 || r->seg_tokens[r->used - 1] >= r->target ||
        r->seg_tokens[r->used - 1] + len > r->max_tokens) {
        if (r->used == r->max_segments)
            ref_corpus_drop_oldest(r);
        r->seg[r->used] = NULL;
        r->seg_len[r->used] = r->seg_tokens[r->used] = r->seg_seqs[r->used] = 0;
        r->used++;
    }
    s = r->used - 1;
    r->seg[s] = realloc(r->seg[s], (r->seg_len[s] + len + 1) * sizeof(int64_t));
    if (r->seg[s] == NULL)
        abort();
    memcpy(r->seg[s] + r->seg_len[s], t, len * sizeof(int64_t));
    r->seg[s][r->seg_len[s] + len] = -1;
    r->seg_len[s] += len + 1;
    r->seg_tokens[s] += len;
    r->seg_seqs[s]++;
    r->tokens += len;
    r->sequences++;
    while (r->tokens > r->max_tokens && r->used > 1)
        ref_corpus_drop_oldest(r);
    return 0;
}

/* pld_corpus_propose_tree, with the taken starts listed per segment. */
static inline size_t ref_corpus_tree(const ref_corpus *r, const int64_t *context, size_t clen,
                                     size_t depth, size_t per_ngram, size_t max_nodes,
                                     const int64_t *eos, size_t n_eos, pld_tree_node *out)
{
    static size_t used[RC_MAX_SEGMENTS][PLD_MAX_NGRAM * PLD_TREE_MAX_PER_NGRAM];
    size_t n_used[RC_MAX_SEGMENTS] = {0}, count = 0, top = 0, n, j;
    while (top < r->max_n && top < clen && context[clen - 1 - top] >= 0)
        top++;
    for (n = top; n >= r->min_n && n >= 1; n--) {
        for (j = r->used; j-- > 0;) {
            size_t starts[PLD_TREE_MAX_PER_NGRAM], found, c, u;
            found = rc_candidates(r->seg[j], r->seg_len[j], context + clen - n, n, 1, per_ngram,
                                  starts);
            for (c = 0; c < found; c++) {
                const size_t st = starts[c];
                size_t cnt = 0;
                int taken = 0;
                for (u = 0; u < n_used[j]; u++)
                    taken |= used[j][u] == st;
                if (taken)
                    continue;
                used[j][n_used[j]++] = st;
                while (cnt < depth && st + cnt < r->seg_len[j] && r->seg[j][st + cnt] >= 0)
                    cnt++;
                rc_insert(r->seg[j] + st, cnt, n, eos, n_eos, max_nodes, out, &count);
            }
        }
    }
    return count;
}

/* The i-th held sequence (oldest first): pointer and length. */
static inline const int64_t *ref_corpus_sequence(const ref_corpus *r, size_t i, size_t *len)
{
    size_t j, p, k;
    for (j = 0; j < r->used; j++) {
        if (i >= r->seg_seqs[j]) {
            i -= r->seg_seqs[j];
            continue;
        }
        for (p = 0, k = 0; k < i; p++)
            if (r->seg[j][p] < 0)
                k++;
        for (*len = 0; r->seg[j][p + *len] >= 0; (*len)++)
            ;
        return r->seg[j] + p;
    }
    *len = 0;
    return NULL;
}

/* 0 if nodes[0..n) is a well-formed trie: parents before children, depth
 * = parent's + 1, each node's children linked (first_child, next_sibling)
 * in creation order and with distinct tokens, support >= 1. Otherwise
 * prints why and returns -1. */
static inline int ref_trie_check(const pld_tree_node *nodes, size_t n)
{
    size_t k, v;
    for (k = 0; k < n; k++) {
        const pld_tree_node *x = &nodes[k];
        if (x->parent < -1 || x->parent >= (int32_t)k) {
            fprintf(stderr, "trie: node %zu has parent %d\n", k, (int)x->parent);
            return -1;
        }
        if (x->depth != (x->parent < 0 ? 1u : nodes[x->parent].depth + 1) || x->support < 1) {
            fprintf(stderr, "trie: node %zu depth %u support %u\n", k, x->depth, x->support);
            return -1;
        }
    }
    /* per parent (-1 .. n-1): the linked list equals the nodes with that
     * parent, in index order */
    for (k = 0; k <= n; k++) {
        const int32_t p = (int32_t)k - 1;
        int32_t link = -2;
        for (v = 0; v < n; v++) {
            size_t w;
            if (nodes[v].parent != p)
                continue;
            for (w = v + 1; w < n; w++)
                if (nodes[w].parent == p && nodes[w].token == nodes[v].token) {
                    fprintf(stderr, "trie: nodes %zu and %zu are equal siblings\n", v, w);
                    return -1;
                }
            if (link == -2) {
                if (p >= 0 && nodes[p].first_child != (int32_t)v) {
                    fprintf(stderr, "trie: node %d's first child is not %zu\n", (int)p, v);
                    return -1;
                }
            } else if (nodes[link].next_sibling != (int32_t)v) {
                fprintf(stderr, "trie: node %d's next sibling is not %zu\n", (int)link, v);
                return -1;
            }
            link = (int32_t)v;
        }
        if (link == -2) {
            if (p >= 0 && nodes[p].first_child != -1) {
                fprintf(stderr, "trie: leaf %d has a first child\n", (int)p);
                return -1;
            }
        } else if (nodes[link].next_sibling != -1) {
            fprintf(stderr, "trie: last child %d has a next sibling\n", (int)link);
            return -1;
        }
    }
    return 0;
}

/* Do got[0..n) and want[0..n) agree on token, parent, depth, ngram and
 * support? Prints the first difference. */
static inline int ref_trees_equal(const pld_tree_node *got, const pld_tree_node *want, size_t n)
{
    size_t v;
    for (v = 0; v < n; v++)
        if (got[v].token != want[v].token || got[v].parent != want[v].parent ||
            got[v].depth != want[v].depth || got[v].ngram != want[v].ngram ||
            got[v].support != want[v].support) {
            fprintf(stderr,
                    "tree node %zu: got (%lld, parent %d, depth %u, ngram %u, support %u), "
                    "want (%lld, %d, %u, %u, %u)\n",
                    v, (long long)got[v].token, (int)got[v].parent, got[v].depth, got[v].ngram,
                    got[v].support, (long long)want[v].token, (int)want[v].parent, want[v].depth,
                    want[v].ngram, want[v].support);
            return 0;
        }
    return 1;
}

#endif /* PLD_NAIVE_CORPUS_H */
