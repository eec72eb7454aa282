/*
 * naive_reference.h -- brute-force references for the pld core, shared by
 * tests/test_core.c and the libFuzzer targets in fuzz/.
 *
 * Each function follows the text of pld.h literally (quadratic and worse)
 * and shares no code with pld_*.c, so the core must agree with it on every
 * input. Nothing here is fast or clever on purpose: keep it that way.
 *
 *   ref_is_eos, ref_suffix_at   small helpers for the lookup references
 *   ref_find                    pld_find_candidate_* / PLD_POLICY_FIRST
 *                               (latest = 0) and PLD_POLICY_RECENT (latest = 1)
 *   ref_frequent                PLD_POLICY_FREQUENT
 *   ref_f16_to_float, ref_bf16_to_float, ref_elem
 *                               element decoding for pld_float_type buffers
 *   ref_tree_depth              the depth of a tree; -1 for a bad parent
 *   ref_tree_greedy, ref_tree_sample
 *                               pld_accept_tree_greedy / _sample: the walk
 *
 * Preconditions are those of pld.h (1 <= min_n <= max_n, k >= 1 for the
 * lookups; valid trees, vocab >= 1 and rows >= n + 1 for the walks);
 * callers check argument errors
 * against the core directly, never through these functions.
 *
 * All functions are `static inline` only so that a file using a subset of
 * them gets no -Wunused-function warning; they are not meant to be fast.
 * Link with -lm (ldexpf).
 */
#ifndef PLD_NAIVE_REFERENCE_H
#define PLD_NAIVE_REFERENCE_H

#include "pld.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- lookup */

/* 1 iff tok ends a draft: PLD_TRANSFORMERS and tok is one of eos[0..n_eos).
 * Under PLD_SEED eos is ignored. */
static inline int ref_is_eos(int64_t tok, const pld_lookup_opts *o)
{
    size_t e;
    if (o->semantics != PLD_TRANSFORMERS)
        return 0;
    for (e = 0; e < o->n_eos; e++)
        if (o->eos[e] == tok)
            return 1;
    return 0;
}

/* 1 iff t[i..i+n) == t[len-n..len), i.e. the suffix n-gram occurs at i.
 * Requires n <= len and i + n <= len. */
static inline int ref_suffix_at(const int64_t *t, size_t len, size_t i,
                                size_t n)
{
    size_t j;
    for (j = 0; j < n; j++)
        if (t[i + j] != t[len - n + j])
            return 0;
    return 1;
}

/* Lookup by the letter of pld.h ("Lookup semantics").
 *
 * latest == 0: the EARLIEST occurrence of the suffix n-gram is the only one
 *   considered for each n -- pld_find_candidate_* and PLD_POLICY_FIRST.
 * latest == 1: the LATEST VALID occurrence of the suffix n-gram wins, with
 *   the same validity rules -- PLD_POLICY_RECENT.
 *
 * Validity of an occurrence at i (start s = i + n):
 *   PLD_SEED:          i + n + k <= len and i + n < len - n
 *   PLD_TRANSFORMERS:  s < e, e = min(s + k, len, max_length if >= 0)
 *
 * Returns the draft length and sets *start to the draft's first position
 * in t (the draft is t[*start .. *start + count)); *start is 0 when there
 * is no match. Under PLD_TRANSFORMERS the draft is cut before its first eos
 * token, and a draft cut to nothing is empty: no further n is tried. */
static inline size_t ref_find(const int64_t *t, size_t len, size_t min_n,
                              size_t max_n, size_t k,
                              const pld_lookup_opts *o, int latest,
                              size_t *start)
{
    size_t n;
    *start = 0;
    if (o->semantics == PLD_SEED) {
        /* n from max_n down to min_n, skipping n > len */
        for (n = max_n; n >= min_n; n--) {
            size_t i, best = (size_t)-1;
            if (n > len)
                continue;
            for (i = 0; i + n <= len; i++) {
                int valid;
                if (!ref_suffix_at(t, len, i, n))
                    continue;
                valid = k <= len - (i + n) && i + n < len - n; /* i + n + k <= len */
                if (valid)
                    best = i;
                if (!latest)
                    break; /* only the earliest occurrence counts */
            }
            if (best != (size_t)-1) {
                *start = best + n;
                return k;
            }
        }
        return 0;
    } else {
        size_t top;
        if (o->max_length >= 0 && (uint64_t)o->max_length == (uint64_t)len + 1)
            return 0;
        if (len == 0)
            return 0;
        /* n from min(max_n, len - 1) down to min_n */
        top = max_n < len - 1 ? max_n : len - 1;
        for (n = top; n >= min_n && n >= 1; n--) {
            size_t i, best = (size_t)-1, bend = 0;
            for (i = 0; i + n <= len; i++) {
                size_t s = i + n, e = k < len - s ? s + k : len; /* min(s + k, len) */
                if (!ref_suffix_at(t, len, i, n))
                    continue;
                if (e > len)
                    e = len;
                if (o->max_length >= 0 && (uint64_t)e > (uint64_t)o->max_length)
                    e = (size_t)o->max_length;
                if (s < e) {
                    best = i;
                    bend = e;
                }
                if (!latest)
                    break; /* only the earliest occurrence counts */
            }
            if (best != (size_t)-1) {
                size_t s = best + n, c = 0;
                while (s + c < bend && !ref_is_eos(t[s + c], o))
                    c++;
                *start = s;
                return c; /* cut to nothing: empty, no further n */
            }
        }
        return 0;
    }
}

/* pld_index_propose_voted on a RECENT index, by the letter of pld.h: for
 * the largest n-gram size with a valid occurrence (sizes and validity as
 * ref_find's), the newest `voters` valid occurrences vote token by token
 * on their continuations; the draft is then cut before its first eos
 * (PLD_TRANSFORMERS). Writes it to out[0..return value) (out holds k
 * tokens). Requires 1 <= voters <= 64. */
static inline size_t ref_voted(const int64_t *t, size_t len, size_t min_n, size_t max_n,
                               size_t k, const pld_lookup_opts *o, size_t voters,
                               int64_t *out)
{
    size_t start[64], end[64], m = 0, n, top, d, j, c, i;
    if (o->semantics == PLD_SEED) {
        top = max_n;
    } else {
        if ((o->max_length >= 0 && (uint64_t)o->max_length == (uint64_t)len + 1) || len == 0)
            return 0;
        top = max_n < len - 1 ? max_n : len - 1;
    }
    for (n = top; n >= min_n && n >= 1 && m == 0; n--) {
        if (n > len)
            continue;
        for (i = len - n + 1; i-- > 0 && m < voters;) { /* newest first */
            size_t s = i + n, e;
            if (!ref_suffix_at(t, len, i, n))
                continue;
            if (o->semantics == PLD_SEED) {
                if (!(k <= len - s && s < len - n))
                    continue;
                e = s + k;
            } else {
                e = k < len - s ? s + k : len;
                if (o->max_length >= 0 && (uint64_t)e > (uint64_t)o->max_length)
                    e = (size_t)o->max_length;
                if (!(s < e))
                    continue;
            }
            start[m] = s;
            end[m++] = e;
        }
    }
    for (d = 0; d < k; d++) {
        size_t kept = 0, best = 0, best_votes = 0;
        for (j = 0; j < m; j++)
            if (start[j] + d < end[j]) {
                start[kept] = start[j];
                end[kept++] = end[j];
            }
        m = kept;
        if (m == 0)
            break;
        for (j = 0; j < m; j++) {
            size_t votes = 0;
            for (c = 0; c < m; c++)
                votes += t[start[c] + d] == t[start[j] + d];
            if (votes > best_votes) {
                best_votes = votes;
                best = j;
            }
        }
        out[d] = t[start[best] + d];
        kept = 0;
        for (j = 0; j < m; j++)
            if (t[start[j] + d] == out[d]) {
                start[kept] = start[j];
                end[kept++] = end[j];
            }
        m = kept;
    }
    for (c = 0; c < d && !ref_is_eos(out[c], o); c++)
        ;
    return c;
}

/* PLD_POLICY_FREQUENT by the letter of pld.h. The draft is built one token
 * at a time: the next token is the most frequent follower (in t, i.e. a
 * position i + n < len) of the longest suffix n-gram of t + draft-so-far
 * that has any follower; a tie goes to the follower that reached the
 * count first. Stops at k tokens, when no n-gram has a follower, or (under
 * PLD_TRANSFORMERS) before an eos token and at max_length - len - 1 tokens.
 * Writes the draft to out[0..return value) (out holds k tokens). */
static inline size_t ref_frequent(const int64_t *t, size_t len, size_t min_n,
                                  size_t max_n, size_t k,
                                  const pld_lookup_opts *o, int64_t *out)
{
    int64_t *buf = malloc((len + k + 1) * sizeof *buf);  /* t + draft */
    int64_t *ftok = malloc((len + 1) * sizeof *ftok);    /* followers seen */
    size_t *fcnt = malloc((len + 1) * sizeof *fcnt);     /* and their counts */
    size_t kmax = k, d;
    if (!buf || !ftok || !fcnt)
        abort();
    if (len)
        memcpy(buf, t, len * sizeof *buf);
    if (o->semantics == PLD_TRANSFORMERS && o->max_length >= 0) {
        int64_t room = o->max_length - (int64_t)len - 1;
        if (room < 0)
            room = 0;
        if ((uint64_t)room < (uint64_t)kmax)
            kmax = (size_t)room;
    }
    for (d = 0; d < kmax; d++) {
        size_t cur = len + d, n, top = max_n < cur ? max_n : cur;
        int found = 0;
        int64_t tok = 0;
        for (n = top; n >= min_n && n >= 1 && !found; n--) {
            size_t i, nf = 0, bestc = 0;
            for (i = 0; i + n < len; i++) {
                size_t j, f;
                for (j = 0; j < n; j++)
                    if (t[i + j] != buf[cur - n + j])
                        break;
                if (j < n)
                    continue;
                for (f = 0; f < nf; f++)
                    if (ftok[f] == t[i + n])
                        break;
                if (f == nf) {
                    ftok[nf] = t[i + n];
                    fcnt[nf++] = 0;
                }
                fcnt[f]++;
                if (fcnt[f] > bestc) { /* strictly more: first to reach wins */
                    bestc = fcnt[f];
                    tok = ftok[f];
                }
            }
            if (bestc > 0)
                found = 1;
        }
        if (!found)
            break;
        if (ref_is_eos(tok, o))
            break;
        buf[cur] = tok;
        out[d] = tok;
    }
    free(buf);
    free(ftok);
    free(fcnt);
    return d;
}

/* ---------------------------------------------------------- token tree */

/* pld_index_propose_tree by the letter of pld.h ("Token tree"), by brute
 * force: occurrences found by scanning, children found by scanning the
 * nodes. recent: 1 for PLD_POLICY_RECENT. out holds max_nodes nodes (only
 * token, parent, depth, ngram and support are written). Returns the node
 * count. */
static inline size_t ref_tree(const int64_t *t, size_t len, size_t min_n, size_t max_n,
                              int recent, size_t depth, size_t per_ngram, size_t max_nodes,
                              const int64_t *eos, size_t n_eos, pld_tree_node *out)
{
    size_t used[PLD_MAX_NGRAM * PLD_TREE_MAX_PER_NGRAM], n_used = 0, count = 0, n;
    size_t top = max_n < len ? max_n : len;
    for (n = top; n >= min_n && n >= 1; n--) {
        size_t chosen[PLD_TREE_MAX_PER_NGRAM], n_chosen = 0, i, c, seen = 0;
        size_t earliest = len; /* none */
        for (i = 0; i + n <= len; i++)
            if (ref_suffix_at(t, len, i, n)) {
                earliest = i;
                break;
            }
        if (earliest == len)
            continue;
        chosen[n_chosen++] = earliest;
        if (recent) {
            /* the newest per_ngram + 1 occurrences, the suffix (at len - n) first */
            for (i = len - n + 1; i-- > 0 && seen <= per_ngram && n_chosen < per_ngram;) {
                if (!ref_suffix_at(t, len, i, n))
                    continue;
                seen++;
                if (i != len - n && i != earliest)
                    chosen[n_chosen++] = i;
            }
        }
        for (c = 0; c < n_chosen; c++) {
            const size_t start = chosen[c] + n;
            size_t u, j;
            int32_t parent = -1;
            int taken = 0;
            if (start >= len)
                continue;
            for (u = 0; u < n_used; u++)
                taken |= used[u] == start;
            if (taken)
                continue;
            used[n_used++] = start;
            for (j = 0; j < depth && start + j < len; j++) {
                const int64_t tok = t[start + j];
                size_t e, v;
                int is_eos = 0, found = -1;
                for (e = 0; e < n_eos; e++)
                    is_eos |= eos[e] == tok;
                if (is_eos)
                    break;
                for (v = 0; v < count; v++)
                    if (out[v].parent == parent && out[v].token == tok) {
                        found = (int)v;
                        break;
                    }
                if (found < 0) {
                    if (count >= max_nodes)
                        break;
                    found = (int)count++;
                    out[found].token = tok;
                    out[found].parent = parent;
                    out[found].depth = (uint32_t)(j + 1);
                    out[found].ngram = (uint32_t)n;
                    out[found].support = 0;
                }
                out[found].support++;
                parent = found;
            }
        }
    }
    return count;
}

/* --------------------------------------------------------- acceptance */

/* IEEE binary16 bits to float, field by field (subnormals, inf, NaN). */
static inline float ref_f16_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) & 1u, exp = (h >> 10) & 0x1Fu,
             man = h & 0x3FFu;
    float v;
    if (exp == 0)
        v = ldexpf((float)man, -24);
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexpf((float)(man | 0x400u), (int)exp - 25);
    return sign ? -v : v;
}

/* bfloat16 bits to float: the top half of a binary32. */
static inline float ref_bf16_to_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Element i of a buffer of type ft, as float. Reads through memcpy, so p
 * need not be aligned. ft must be PLD_F32, PLD_F16 or PLD_BF16. */
static inline float ref_elem(const void *p, pld_float_type ft, size_t i)
{
    uint16_t h;
    float f;
    if (ft == PLD_F32) {
        memcpy(&f, (const char *)p + 4 * i, 4);
        return f;
    }
    memcpy(&h, (const char *)p + 2 * i, 2);
    if (ft == PLD_F16)
        return ref_f16_to_float(h);
    return ref_bf16_to_float(h);
}

/* The depth of the tree parents[0..n) (0 when n is 0): each node's depth
 * counted by climbing to the root; -1 if a parents[i] is outside [-1, i). */
static inline long ref_tree_depth(const int64_t *parents, size_t n)
{
    size_t i;
    long deepest = 0;
    for (i = 0; i < n; i++)
        if (parents[i] < -1 || parents[i] >= (int64_t)i)
            return -1;
    for (i = 0; i < n; i++) {
        long d = 0;
        int64_t v = (int64_t)i;
        while (v >= 0) {
            d++;
            v = parents[v];
        }
        if (d > deepest)
            deepest = d;
    }
    return deepest;
}

/* The least c > node with parents[c] == node and nodes[c] == t; -1: none. */
static inline int64_t ref_first_child(const int64_t *nodes, const int64_t *parents, size_t n,
                                      int64_t node, int64_t t)
{
    size_t c;
    for (c = 0; c < n; c++)
        if ((int64_t)c > node && parents[c] == node && nodes[c] == t)
            return (int64_t)c;
    return -1;
}

/* pld.h's walk with the model's tokens given: choices[0..n]. Returns m,
 * path[0..m) and out[0..m]. */
static inline size_t ref_tree_greedy(const int64_t *nodes, const int64_t *parents, size_t n,
                                     const int64_t *choices, size_t *path, int64_t *out)
{
    int64_t node = -1;
    size_t m = 0;
    for (;;) {
        int64_t c;
        out[m] = choices[node + 1];
        c = ref_first_child(nodes, parents, n, node, out[m]);
        if (c < 0)
            return m;
        path[m++] = (size_t)c;
        node = c;
    }
}

/* The inverse-CDF draw of pld.h from row r of a rows x vocab buffer with
 * u; -1 if the row has a NaN, a negative or infinite entry, or no mass. */
static inline int64_t ref_draw(const void *p, pld_float_type ft, size_t r, size_t vocab,
                               double u)
{
    double sum = 0, acc = 0;
    size_t v;
    int64_t last = -1;
    for (v = 0; v < vocab; v++) {
        const float x = ref_elem(p, ft, r * vocab + v);
        if (isnan(x) || isinf(x) || x < 0)
            return -1;
        sum += x;
    }
    if (!(sum > 0))
        return -1;
    for (v = 0; v < vocab; v++) {
        const float x = ref_elem(p, ft, r * vocab + v);
        if (x > 0) {
            last = (int64_t)v;
            acc += x;
            if (u * sum < acc)
                return (int64_t)v;
        }
    }
    return last;
}

/* pld.h's walk with draws: the token at depth d from uniforms[d]. Returns
 * m (path[0..m), out[0..m]), or -1 where pld_accept_tree_sample returns
 * PLD_ERR_VALUE. */
static inline long ref_tree_sample(const int64_t *nodes, const int64_t *parents, size_t n,
                                   const void *probs, pld_float_type ft, size_t vocab,
                                   const double *uniforms, size_t *path, int64_t *out)
{
    int64_t node = -1;
    size_t m = 0;
    for (;;) {
        int64_t c, t = ref_draw(probs, ft, (size_t)(node + 1), vocab, uniforms[m]);
        if (t < 0)
            return -1;
        out[m] = t;
        c = ref_first_child(nodes, parents, n, node, t);
        if (c < 0)
            return (long)m;
        path[m++] = (size_t)c;
        node = c;
    }
}

#endif /* PLD_NAIVE_REFERENCE_H */
