/*
 * pld_rules.h -- the match rules of both lookup semantics, shared by the
 * one-shot lookup and the incremental index so that they cannot drift
 * apart. Internal header: static inline functions only.
 */
#ifndef PLD_RULES_H
#define PLD_RULES_H

#include "pld.h"

/* The largest n-gram size worth trying on a sequence of len tokens, or 0
 * when no size can give a draft. */
static inline size_t pld_rule_top(size_t len, size_t min_n, size_t max_n,
                                  const pld_lookup_opts *opts)
{
    size_t top = max_n;
    if (opts->semantics == PLD_TRANSFORMERS) {
        if (opts->max_length >= 0 && (uint64_t)opts->max_length == (uint64_t)len + 1)
            return 0; /* the model's own next token already hits max_length */
        if (len == 0)
            return 0;
        if (top > len - 1)
            top = len - 1;
    } else if (top > len) {
        top = len;
    }
    if (top > PLD_MAX_NGRAM)
        top = PLD_MAX_NGRAM;
    return top >= min_n ? top : 0;
}

/* Where a continuation may end: the sequence end, or max_length. */
static inline size_t pld_rule_limit(size_t len, const pld_lookup_opts *opts)
{
    if (opts->semantics == PLD_TRANSFORMERS && opts->max_length >= 0 &&
        (uint64_t)opts->max_length < (uint64_t)len)
        return (size_t)opts->max_length;
    return len;
}

/* Is the occurrence of the suffix n-gram at i a valid match? Validity is
 * monotone: if it holds at i it holds at every earlier occurrence. */
static inline int pld_rule_valid(size_t i, size_t n, size_t len, size_t k,
                                 size_t limit, const pld_lookup_opts *opts)
{
    if (opts->semantics == PLD_TRANSFORMERS)
        return i + n < limit;
    /* i + n + k <= len, written so that a k near SIZE_MAX cannot wrap */
    return i + n <= len && k <= len - (i + n) && i + 2 * n < len;
}

/* The draft slice of a valid match at i (eos not yet applied). */
static inline void pld_rule_slice(size_t i, size_t n, size_t k, size_t limit,
                                  const pld_lookup_opts *opts, size_t *start,
                                  size_t *count)
{
    *start = i + n;
    *count = k;
    if (opts->semantics == PLD_TRANSFORMERS && limit - *start < k)
        *count = limit - *start;
}

static inline int pld_is_eos(int64_t token, const pld_lookup_opts *opts)
{
    size_t e;
    if (opts->semantics != PLD_TRANSFORMERS)
        return 0;
    for (e = 0; e < opts->n_eos; e++)
        if (opts->eos[e] == token)
            return 1;
    return 0;
}

#endif /* PLD_RULES_H */
