/*
 * pld_accept.c -- accepting a verified draft: greedy (from ids or from
 * logits) and exact speculative sampling for a deterministic draft, plus the
 * small generator that feeds it. See pld.h for the contracts.
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

/* ------------------------------------------------------------------ greedy */

size_t pld_accept_greedy_ids(const int64_t *draft, size_t k,
                             const int64_t *chosen)
{
    size_t n = 0;
    while (n < k && draft[n] == chosen[n])
        n++;
    return n;
}

/* The first maximal index; the first NaN wins over any number. */
#define PLD_DEFINE_ARGMAX(NAME, T, LOAD)                                       \
    static size_t NAME(const T *row, size_t vocab)                             \
    {                                                                          \
        size_t best = 0, v;                                                    \
        float best_value = LOAD(row[0]);                                       \
        if (isnan(best_value))                                                 \
            return 0;                                                          \
        for (v = 1; v < vocab; v++) {                                          \
            const float x = LOAD(row[v]);                                      \
            if (x > best_value) {                                              \
                best_value = x;                                                \
                best = v;                                                      \
            } else if (isnan(x)) {                                             \
                return v;                                                      \
            }                                                                  \
        }                                                                      \
        return best;                                                           \
    }

#define PLD_LOAD_F32(x) (x)
PLD_DEFINE_ARGMAX(argmax_f32, float, PLD_LOAD_F32)
PLD_DEFINE_ARGMAX(argmax_f16, uint16_t, load_f16)
PLD_DEFINE_ARGMAX(argmax_bf16, uint16_t, load_bf16)

pld_status pld_accept_greedy_logits(const void *logits, pld_float_type ftype,
                                    size_t rows, size_t vocab,
                                    const int64_t *draft, size_t k,
                                    int64_t *out, size_t *n_accepted)
{
    const unsigned char *base = logits;
    size_t i;
    if (logits == NULL || out == NULL || n_accepted == NULL || vocab == 0 ||
        !valid_ftype(ftype) || rows < k + 1 || (k > 0 && draft == NULL))
        return PLD_ERR_ARG;
    for (i = 0; i <= k; i++) {
        const void *row = base + i * vocab * float_size(ftype);
        size_t best;
        switch (ftype) {
        case PLD_F16:
            best = argmax_f16(row, vocab);
            break;
        case PLD_BF16:
            best = argmax_bf16(row, vocab);
            break;
        default:
            best = argmax_f32(row, vocab);
            break;
        }
        out[i] = (int64_t)best;
        if (i == k || draft[i] != out[i])
            break;
    }
    *n_accepted = i;
    return PLD_OK;
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

/* Inverse-CDF draw from row with `skip` left out (skip >= vocab: none). */
static pld_status draw(const void *row, pld_float_type ftype, size_t vocab,
                       double mass, size_t skip, double u, int64_t *token)
{
    const double target = u * mass;
    double acc = 0.0;
    size_t v, last = vocab;
    if (!(mass > 0.0))
        return PLD_ERR_VALUE;
    for (v = 0; v < vocab; v++) {
        double p;
        if (v == skip)
            continue;
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

pld_status pld_accept_sample(const void *probs, pld_float_type ftype,
                             size_t rows, size_t vocab,
                             const int64_t *draft, size_t k,
                             const double *uniforms,
                             int64_t *out, size_t *n_accepted)
{
    const unsigned char *base = probs;
    const size_t stride = vocab * float_size(ftype);
    size_t i;
    if (probs == NULL || uniforms == NULL || out == NULL ||
        n_accepted == NULL || vocab == 0 || !valid_ftype(ftype) ||
        rows < k + 1 || (k > 0 && draft == NULL))
        return PLD_ERR_ARG;
    for (i = 0; i <= k; i++) {
        const void *row = base + i * stride;
        double sum;
        pld_status st = row_sum(row, ftype, vocab, &sum);
        if (st != PLD_OK)
            return st;
        if (i < k) {
            const int64_t x = draft[i];
            const int in_vocab = x >= 0 && (uint64_t)x < (uint64_t)vocab;
            const double px = in_vocab ? load_at(row, ftype, (size_t)x) : 0.0;
            if (uniforms[i] * sum < px) {
                out[i] = x;
                continue;
            }
            /* Rejected: draw from p without x, renormalised. */
            st = draw(row, ftype, vocab, sum - px,
                      in_vocab ? (size_t)x : vocab, uniforms[k], &out[i]);
        } else {
            st = draw(row, ftype, vocab, sum, vocab, uniforms[k], &out[i]);
        }
        if (st != PLD_OK)
            return st;
        break;
    }
    *n_accepted = i;
    return PLD_OK;
}

/* --------------------------------------------------------------- generator */

static inline uint64_t rotl(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

void pld_rng_seed(pld_rng *rng, uint64_t seed)
{
    int i;
    for (i = 0; i < 4; i++) {
        uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        rng->s[i] = z ^ (z >> 31);
    }
}

double pld_rng_uniform(pld_rng *rng)
{
    uint64_t *s = rng->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return (double)(result >> 11) * 0x1.0p-53;
}
