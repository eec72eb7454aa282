/*
 * pld_lookup.c -- one-shot prompt lookup over a token buffer.
 *
 * One pass over the sequence finds, for every n in [min_n, max_n], the
 * earliest occurrence of the suffix n-gram: at each end position j the
 * backward match length against the sequence's end tells which suffix
 * n-grams end at j. The earliest occurrence is all either semantics needs
 * (see pld.h), so the scan stops once the largest n has been seen.
 */
#include "pld.h"

#include "pld_rules.h"

#define PLD_DEFINE_FIND(SUFFIX, T)                                             \
    pld_status pld_find_candidate_##SUFFIX(                                    \
        const T *tokens, size_t len, size_t min_n, size_t max_n, size_t k,     \
        const pld_lookup_opts *opts, size_t *start, size_t *count)             \
    {                                                                          \
        size_t first[PLD_MAX_NGRAM + 1];                                       \
        size_t top, found, j;                                                  \
        if (opts == NULL || start == NULL || count == NULL || min_n < 1 ||     \
            min_n > max_n || max_n > PLD_MAX_NGRAM || k < 1)                                          \
            return PLD_ERR_ARG;                                                \
        *start = 0;                                                            \
        *count = 0;                                                            \
        if (len == 0)                                                          \
            return PLD_OK;                                                     \
        top = pld_rule_top(len, min_n, max_n, opts);                          \
        if (top == 0)                                                          \
            return PLD_OK;                                                     \
        /* first[n]: earliest start of the suffix n-gram; found: the largest  \
         * n whose earliest occurrence is known (all smaller ones are too,    \
         * since an n-gram's occurrence ends where its suffix's does). */     \
        found = min_n - 1;                                                     \
        {                                                                      \
            const T last = tokens[len - 1];                                    \
            for (j = 0; j < len && found < top; j++) {                         \
                size_t m;                                                      \
                if (tokens[j] != last)                                         \
                    continue;                                                  \
                m = 1;                                                         \
                while (m < top && m <= j &&                                    \
                       tokens[j - m] == tokens[len - 1 - m])                   \
                    m++;                                                       \
                while (found < m) {                                            \
                    found++;                                                   \
                    if (found >= min_n)                                        \
                        first[found] = j + 1 - found;                          \
                }                                                              \
            }                                                                  \
        }                                                                      \
        /* The self-match at j = len - 1 guarantees found == top here. */     \
        {                                                                      \
            const size_t limit = pld_rule_limit(len, opts);                    \
            size_t n;                                                          \
            for (n = top; n >= min_n; n--) {                                   \
                if (pld_rule_valid(first[n], n, len, k, limit, opts)) {        \
                    pld_rule_slice(first[n], n, k, limit, opts, start, count); \
                    break;                                                     \
                }                                                              \
            }                                                                  \
        }                                                                      \
        if (*count > 0 && opts->n_eos > 0) {                                   \
            size_t c;                                                          \
            for (c = 0; c < *count; c++)                                       \
                if (pld_is_eos((int64_t)tokens[*start + c], opts))             \
                    break;                                                     \
            *count = c;                                                        \
        }                                                                      \
        return PLD_OK;                                                         \
    }

PLD_DEFINE_FIND(i64, int64_t)
PLD_DEFINE_FIND(i32, int32_t)
