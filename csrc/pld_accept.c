/*
 * pld_accept.c -- accepting a verified token tree: the walk from the root
 * along the model's tokens, given (greedy) or drawn by inverse CDF from
 * its probabilities (sampling). See pld.h for the contracts.
 */
#include "pld.h"

#include <math.h>
#include <string.h>

/* --------------------------------------------------------- float loading */

static inline float load_f16(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    uint32_t bits;
    float f;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf or NaN */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else {
        /* zero or subnormal: man * 2^-24 is exact in float */
        f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float load_bf16(uint16_t h)
{
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float load_at(const void *base, pld_float_type ftype, size_t i)
{
    switch (ftype) {
    case PLD_F16:
        return load_f16(((const uint16_t *)base)[i]);
    case PLD_BF16:
        return load_bf16(((const uint16_t *)base)[i]);
    default:
        return ((const float *)base)[i];
    }
}

static inline size_t float_size(pld_float_type ftype)
{
    return ftype == PLD_F32 ? 4 : 2;
}

static int valid_ftype(pld_float_type ftype)
{
    return ftype == PLD_F32 || ftype == PLD_F16 || ftype == PLD_BF16;
}

/* ---------------------------------------------------------------- sampling */

/* Sum of a row; PLD_ERR_VALUE for NaN, infinite or negative entries. */
static pld_status row_sum(const void *row, pld_float_type ftype, size_t vocab,
                          double *sum)
{
    double s = 0.0;
    size_t v;
    for (v = 0; v < vocab; v++) {
        const float p = load_at(row, ftype, v);
        if (!(p >= 0.0f) || isinf(p))
            return PLD_ERR_VALUE;
        s += p;
    }
    *sum = s;
    return PLD_OK;
}

/* The inverse-CDF draw from row (its sum `mass`) with u: the least v with
 * p[v] > 0 and u * mass < p[0] + ... + p[v]. */
static pld_status draw(const void *row, pld_float_type ftype, size_t vocab,
                       double mass, double u, int64_t *token)
{
    const double target = u * mass;
    double acc = 0.0;
    size_t v, last = vocab;
    if (!(mass > 0.0))
        return PLD_ERR_VALUE;
    for (v = 0; v < vocab; v++) {
        double p;
        p = load_at(row, ftype, v);
        if (p <= 0.0)
            continue;
        last = v;
        acc += p;
        if (target < acc) {
            *token = (int64_t)v;
            return PLD_OK;
        }
    }
    if (last == vocab)
        return PLD_ERR_VALUE;
    *token = (int64_t)last; /* rounding left u * mass at the very top */
    return PLD_OK;
}

/* ------------------------------------------------------------------- trees */

pld_status pld_tree_depths(const int64_t *parents, size_t n, size_t *depths, size_t *depth)
{
    size_t i, deepest = 0;
    if (depth == NULL || (n > 0 && (parents == NULL || depths == NULL)))
        return PLD_ERR_ARG;
    for (i = 0; i < n; i++) {
        const int64_t p = parents[i];
        if (p < -1 || (p >= 0 && (uint64_t)p >= (uint64_t)i))
            return PLD_ERR_ARG;
        depths[i] = p < 0 ? 1 : depths[p] + 1;
        if (depths[i] > deepest)
            deepest = depths[i];
    }
    *depth = deepest;
    return PLD_OK;
}

/* The first child of `node` (-1: the root) with token t; -1 if none. The
 * scan starts after node, so a walk reads each node at most twice. */
static int64_t first_child(const int64_t *nodes, const int64_t *parents, size_t n, int64_t node,
                           int64_t t)
{
    size_t c;
    for (c = (size_t)(node + 1); c < n; c++)
        if (parents[c] == node && nodes[c] == t)
            return (int64_t)c;
    return -1;
}

/* The arguments both walks share; the depths go to path as scratch. */
static pld_status check_tree(const int64_t *nodes, const int64_t *parents, size_t n,
                             size_t *path, const int64_t *out, const size_t *n_path,
                             size_t *depth)
{
    if (out == NULL || n_path == NULL || (n > 0 && nodes == NULL))
        return PLD_ERR_ARG;
    return pld_tree_depths(parents, n, path, depth);
}

pld_status pld_accept_tree_greedy(const int64_t *nodes, const int64_t *parents, size_t n,
                                  const int64_t *choices, size_t *path, int64_t *out,
                                  size_t *n_path)
{
    int64_t node = -1;
    size_t m = 0, depth;
    pld_status st = check_tree(nodes, parents, n, path, out, n_path, &depth);
    if (st != PLD_OK)
        return st;
    if (choices == NULL)
        return PLD_ERR_ARG;
    for (;;) {
        const int64_t t = choices[node + 1];
        out[m] = t;
        node = first_child(nodes, parents, n, node, t);
        if (node < 0)
            break;
        path[m++] = (size_t)node;
    }
    *n_path = m;
    return PLD_OK;
}

pld_status pld_accept_tree_sample(const int64_t *nodes, const int64_t *parents, size_t n,
                                  const void *probs, pld_float_type ftype, size_t rows,
                                  size_t vocab, const double *uniforms, size_t n_uniforms,
                                  size_t *path, int64_t *out, size_t *n_path)
{
    const unsigned char *base = probs;
    int64_t node = -1;
    size_t m = 0, depth;
    pld_status st = check_tree(nodes, parents, n, path, out, n_path, &depth);
    if (st != PLD_OK)
        return st;
    if (probs == NULL || uniforms == NULL || vocab == 0 || !valid_ftype(ftype) || rows <= n ||
        n_uniforms <= depth)
        return PLD_ERR_ARG;
    for (;;) {
        const void *row = base + (size_t)(node + 1) * vocab * float_size(ftype);
        double sum;
        int64_t t;
        st = row_sum(row, ftype, vocab, &sum);
        if (st == PLD_OK)
            st = draw(row, ftype, vocab, sum, uniforms[m], &t);
        if (st != PLD_OK)
            return st;
        out[m] = t; /* position node + 1 has depth m */
        node = first_child(nodes, parents, n, node, t);
        if (node < 0)
            break;
        path[m++] = (size_t)node;
    }
    *n_path = m;
    return PLD_OK;
}
