/*
 * test_corpus.c -- plain C tests of pld_index_propose_tree_after and
 * pld_corpus (no framework), against the brute-force references of
 * naive_corpus.h.
 *
 * Every CHECK counts one passed or failed assertion; the program ends with
 * "test_corpus: N passed, M failed" and exits nonzero if M > 0.
 */
#include "pld.h"
#include "pld_internal.h"
#include "check.h"
#include "naive_corpus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NODES 96

/* ------------------------------------------------ propose_tree_after */

static void test_after_hand(void)
{
    /* seq: 1 2 3 | 1 2 4 | 1 2 3 5 */
    const int64_t seq[] = {1, 2, 3, 1, 2, 4, 1, 2, 3, 5};
    const int64_t ctx[] = {9, 1, 2};
    pld_tree_node out[NODES];
    size_t n = 0;
    pld_index *rec = pld_index_new_keyed(1, 3, PLD_POLICY_RECENT, 7);
    pld_index *first = pld_index_new_keyed(1, 3, PLD_POLICY_FIRST, 7);
    CHECK(rec != NULL && first != NULL);
    CHECK(pld_index_extend(rec, seq, 10) == PLD_OK);
    CHECK(pld_index_extend(first, seq, 10) == PLD_OK);
    /* RECENT, n = 2 ("1 2" at 6, 3, 0, newest first: 3 5, 4 1, 3 1), then
     * n = 1 ("2" at 7, 4, 1: every start taken by n = 2) */
    CHECK(pld_index_propose_tree_after(rec, ctx, 3, 2, 4, NODES, NULL, 0, out, &n) == PLD_OK);
    CHECKF(n == 5, "n = %zu", n);
    if (n == 5) {
        CHECK(out[0].token == 3 && out[0].parent == -1 && out[0].support == 2 && out[0].ngram == 2);
        CHECK(out[1].token == 5 && out[1].parent == 0 && out[1].depth == 2);
        CHECK(out[2].token == 4 && out[2].parent == -1 && out[2].support == 1);
        CHECK(out[3].token == 1 && out[3].parent == 2);
        CHECK(out[4].token == 1 && out[4].parent == 0);
        CHECK(ref_trie_check(out, n) == 0);
    }
    /* FIRST: the earliest "1 2" only, then "2" at 1: taken */
    n = 0;
    CHECK(pld_index_propose_tree_after(first, ctx, 3, 2, 4, NODES, NULL, 0, out, &n) == PLD_OK);
    CHECK(n == 2 && out[0].token == 3 && out[1].token == 1 && out[1].parent == 0);
    /* merged into it: the RECENT trie shares "3", adds "5" under it */
    CHECK(pld_index_propose_tree_after(rec, ctx, 3, 2, 4, NODES, NULL, 0, out, &n) == PLD_OK);
    CHECKF(n == 5, "n = %zu", n);
    if (n == 5) {
        CHECK(out[0].support == 3);             /* 1 + 2 */
        CHECK(out[1].token == 1 && out[1].support == 2 && out[1].ngram == 2);
        CHECK(out[2].token == 5 && out[2].parent == 0);
        CHECK(out[0].first_child == 1 && out[1].next_sibling == 2 && out[2].next_sibling == -1);
        CHECK(ref_trie_check(out, n) == 0);
    }
    /* eos cuts, max_nodes stops, context shorter than min_n finds nothing */
    n = 0;
    {
        const int64_t eos[] = {3};
        CHECK(pld_index_propose_tree_after(rec, ctx, 3, 4, 4, NODES, eos, 1, out, &n) == PLD_OK);
        CHECK(n == 3 && out[0].token == 4);
    }
    n = 0;
    CHECK(pld_index_propose_tree_after(rec, ctx, 3, 4, 4, 1, NULL, 0, out, &n) == PLD_OK);
    CHECK(n == 1 && out[0].token == 3 && out[0].support == 2);
    n = 0;
    CHECK(pld_index_propose_tree_after(rec, ctx, 0, 4, 4, NODES, NULL, 0, out, &n) == PLD_OK);
    CHECK(n == 0);
    CHECK(pld_index_propose_tree_after(rec, NULL, 0, 4, 4, NODES, NULL, 0, out, &n) == PLD_OK);
    CHECK(n == 0);
    /* negative ids are ids like any other */
    {
        const int64_t neg[] = {-5, -1, -5, -2, -5, -1, -3};
        const int64_t c2[] = {-5, -1};
        pld_index *x = pld_index_new_keyed(1, 2, PLD_POLICY_RECENT, 1);
        CHECK(x != NULL && pld_index_extend(x, neg, 7) == PLD_OK);
        n = 0;
        CHECK(pld_index_propose_tree_after(x, c2, 2, 1, 4, NODES, NULL, 0, out, &n) == PLD_OK);
        CHECK(n == 2 && out[0].token == -3 && out[1].token == -5);
        pld_index_free(x);
    }
    pld_index_free(rec);
    pld_index_free(first);
}

static void test_after_errors(void)
{
    const int64_t seq[] = {1, 2, 1, 2, 3};
    pld_tree_node out[8];
    size_t n = 0;
    pld_index *ix = pld_index_new_keyed(1, 2, PLD_POLICY_RECENT, 3);
    CHECK(pld_index_extend(ix, seq, 5) == PLD_OK);
    CHECK(pld_index_propose_tree_after(NULL, seq, 2, 1, 1, 8, NULL, 0, out, &n) == PLD_ERR_ARG);
    CHECK(pld_index_propose_tree_after(ix, seq, 2, 1, 1, 8, NULL, 0, out, NULL) == PLD_ERR_ARG);
    CHECK(pld_index_propose_tree_after(ix, NULL, 2, 1, 1, 8, NULL, 0, out, &n) == PLD_ERR_ARG);
    CHECK(pld_index_propose_tree_after(ix, seq, 2, 0, 1, 8, NULL, 0, out, &n) == PLD_ERR_ARG);
    CHECK(pld_index_propose_tree_after(ix, seq, 2, 1, 0, 8, NULL, 0, out, &n) == PLD_ERR_ARG);
    CHECK(pld_index_propose_tree_after(ix, seq, 2, 1, PLD_TREE_MAX_PER_NGRAM + 1, 8, NULL, 0,
                                       out, &n) == PLD_ERR_ARG);
    CHECK(pld_index_propose_tree_after(ix, seq, 2, 1, 1, PLD_TREE_MAX_NODES + 1, NULL, 0, out,
                                       &n) == PLD_ERR_ARG);
    CHECK(pld_index_propose_tree_after(ix, seq, 2, 1, 1, 8, NULL, 0, NULL, &n) == PLD_ERR_ARG);
    CHECK(pld_index_propose_tree_after(ix, seq, 2, 1, 1, 8, NULL, 1, out, &n) == PLD_ERR_ARG);
    n = 9; /* more nodes than max_nodes */
    CHECK(pld_index_propose_tree_after(ix, seq, 2, 1, 1, 8, NULL, 0, out, &n) == PLD_ERR_ARG);
    CHECK(n == 9);
    /* forged tries: a parent after its node, links backwards or past the end */
    {
        static const int32_t forged[][3] = {{1, -1, -1}, {-1, 0, -1}, {-1, -1, 0},
                                            {-1, 5, -1}, {-1, -1, 5}, {-2, -1, -1}};
        size_t f;
        for (f = 0; f < sizeof(forged) / sizeof(forged[0]); f++) {
            memset(out, 0, sizeof(out));
            out[0].parent = -1;
            out[0].first_child = -1;
            out[0].next_sibling = -1;
            out[0].depth = out[0].support = 1;
            out[1].parent = forged[f][0];
            out[1].first_child = forged[f][1];
            out[1].next_sibling = forged[f][2];
            n = 2;
            CHECKF(pld_index_propose_tree_after(ix, seq, 2, 1, 1, 8, NULL, 0, out, &n) ==
                       PLD_ERR_ARG, "forged %zu", f);
            CHECK(n == 2 && out[1].parent == forged[f][0]);
        }
    }
    /* max_nodes 0 and out NULL is fine */
    n = 0;
    CHECK(pld_index_propose_tree_after(ix, seq, 2, 1, 1, 0, NULL, 0, NULL, &n) == PLD_OK && n == 0);
    pld_index_free(ix);
}

/* Random sequences over a small vocabulary, every policy, random contexts
 * (often a slice of the sequence), merged over two indexes. */
static void test_after_random(void)
{
    static int64_t seq[2][160];
    static pld_tree_node got[NODES], want[NODES];
    int round;
    for (round = 0; round < 3000; round++) {
        const size_t min_n = 1 + t_below(3), max_n = min_n + t_below(4);
        const size_t vocab = 1 + t_below(5), depth = 1 + t_below(8);
        const size_t per_ngram = 1 + t_below(6), max_nodes = t_below(NODES + 1);
        const int policy = (int)t_below(3);
        const size_t n_eos = t_below(3);
        int64_t eos[2], ctx[12];
        size_t len[2], clen = t_below(12), k, n_got = 0, n_want = 0, p;
        pld_index *ix[2];
        eos[0] = (int64_t)t_below(vocab);
        eos[1] = (int64_t)t_below(vocab);
        for (p = 0; p < 2; p++) {
            len[p] = t_below(160);
            for (k = 0; k < len[p]; k++)
                seq[p][k] = (int64_t)t_below(vocab) - (vocab > 3 ? 1 : 0);
            ix[p] = pld_index_new_keyed(min_n, max_n, (pld_policy)policy, t_next());
            /* in pieces, with a truncation, so lazily filed FIRST tables are hit */
            CHECK(pld_index_extend(ix[p], seq[p], len[p] / 2) == PLD_OK);
            CHECK(pld_index_truncate(ix[p], len[p] / 3) == PLD_OK);
            CHECK(pld_index_extend(ix[p], seq[p] + len[p] / 3, len[p] - len[p] / 3) == PLD_OK);
        }
        if (t_below(2) && len[0] > clen) {
            const size_t at = t_below(len[0] - clen + 1);
            memcpy(ctx, seq[0] + at, clen * sizeof(int64_t));
        } else {
            for (k = 0; k < clen; k++)
                ctx[k] = (int64_t)t_below(vocab);
        }
        for (p = 0; p < 2; p++) {
            size_t before = n_got;
            pld_status st = pld_index_propose_tree_after(ix[p], ctx, clen, depth, per_ngram,
                                                         max_nodes, eos, n_eos, got, &n_got);
            CHECK(st == PLD_OK);
            n_want = ref_tree_after(seq[p], len[p], min_n, max_n, policy == PLD_POLICY_RECENT,
                                    ctx, clen, depth, per_ngram, max_nodes, eos, n_eos, want,
                                    n_want);
            CHECKF(n_got == n_want && n_got >= before, "round %d index %zu: %zu nodes, want %zu",
                   round, p, n_got, n_want);
            CHECKF(ref_trees_equal(got, want, n_got < n_want ? n_got : n_want), "round %d", round);
            CHECK(ref_trie_check(got, n_got) == 0);
        }
        pld_index_free(ix[0]);
        pld_index_free(ix[1]);
    }
}

/* -------------------------------------------------------------- corpus */

static void test_corpus_new_errors(void)
{
    pld_corpus *c;
    CHECK(pld_corpus_new(0, 1, 2, 1, 0) == NULL);
    CHECK(pld_corpus_new(PLD_CORPUS_MAX_TOKENS + 1, 1, 2, 1, 0) == NULL);
    CHECK(pld_corpus_new(10, 0, 2, 1, 0) == NULL);
    CHECK(pld_corpus_new(10, 3, 2, 1, 0) == NULL);
    CHECK(pld_corpus_new(10, 1, PLD_MAX_NGRAM + 1, 1, 0) == NULL);
    CHECK(pld_corpus_new(10, 1, 2, 0, 0) == NULL);
    CHECK(pld_corpus_new(10, 1, 2, PLD_CORPUS_MAX_SEGMENTS + 1, 0) == NULL);
    c = pld_corpus_new(PLD_CORPUS_MAX_TOKENS, PLD_MAX_NGRAM, PLD_MAX_NGRAM,
                       PLD_CORPUS_MAX_SEGMENTS, 42);
    CHECK(c != NULL);
    if (c != NULL) {
        CHECK(pld_corpus_max_tokens(c) == PLD_CORPUS_MAX_TOKENS);
        CHECK(pld_corpus_min_n(c) == PLD_MAX_NGRAM && pld_corpus_max_n(c) == PLD_MAX_NGRAM);
        CHECK(pld_corpus_max_segments(c) == PLD_CORPUS_MAX_SEGMENTS && pld_corpus_key(c) == 42);
        CHECK(pld_corpus_tokens(c) == 0 && pld_corpus_sequences(c) == 0);
        CHECK(pld_corpus_max_id(c) == -1 && pld_corpus_evicted(c) == 0);
        CHECK(pld_corpus_nbytes(c) > 0);
    }
    pld_corpus_free(c);
    pld_corpus_free(NULL);
}

static void test_corpus_hand(void)
{
    const int64_t a[] = {1, 2, 3, 4}, b[] = {1, 2, 5}, d[] = {7, 1, 2};
    const int64_t ctx[] = {0, 1, 2};
    pld_tree_node out[NODES];
    const int64_t *seq;
    size_t n = 0, len = 0;
    pld_corpus *c = pld_corpus_new(10, 1, 3, 2, 5); /* T = 5 */
    CHECK(pld_corpus_add(c, a, 4) == PLD_OK);
    CHECK(pld_corpus_add(c, b, 3) == PLD_OK); /* same segment: 4 < 5 */
    CHECK(pld_corpus_tokens(c) == 7 && pld_corpus_sequences(c) == 2);
    CHECK(pld_corpus_segments_used(c) == 1 && pld_corpus_max_id(c) == 5);
    /* "1 2" in b (newest) then a; the continuation stops at the separator */
    CHECK(pld_corpus_propose_tree(c, ctx, 3, 4, 4, NODES, NULL, 0, out, &n) == PLD_OK);
    CHECKF(n == 3, "n = %zu", n);
    if (n == 3) {
        CHECK(out[0].token == 5 && out[0].depth == 1 && out[0].ngram == 2);
        CHECK(out[1].token == 3 && out[2].token == 4 && out[2].parent == 1);
    }
    CHECK(pld_corpus_add(c, d, 3) == PLD_OK); /* a new segment: 7 >= 5 */
    CHECK(pld_corpus_segments_used(c) == 2 && pld_corpus_tokens(c) == 10);
    CHECK(pld_corpus_evicted(c) == 0);
    /* d ends with "1 2": nothing follows it but its separator */
    n = 0;
    CHECK(pld_corpus_propose_tree(c, ctx, 3, 4, 4, NODES, NULL, 0, out, &n) == PLD_OK);
    CHECK(n == 3 && out[0].token == 5);
    CHECK(pld_corpus_sequence(c, 2, &seq, &len) == PLD_OK && len == 3 && seq[0] == 7);
    CHECK(pld_corpus_sequence(c, 0, &seq, &len) == PLD_OK && len == 4 && seq[3] == 4);
    CHECK(pld_corpus_sequence(c, 3, &seq, &len) == PLD_ERR_ARG && seq == NULL && len == 0);
    /* 11 > 10: the oldest segment (a and b) goes */
    CHECK(pld_corpus_add(c, a, 1) == PLD_OK);
    CHECK(pld_corpus_tokens(c) == 4 && pld_corpus_sequences(c) == 2);
    CHECK(pld_corpus_evicted(c) == 2 && pld_corpus_max_id(c) == 7);
    CHECK(pld_corpus_sequence(c, 0, &seq, &len) == PLD_OK && len == 3 && seq[0] == 7);
    CHECK(pld_corpus_sequence(c, 1, &seq, &len) == PLD_OK && len == 1 && seq[0] == 1);
    /* refusals change nothing */
    {
        const int64_t bad[] = {1, -1, 2};
        static int64_t big[11];
        CHECK(pld_corpus_add(c, bad, 3) == PLD_ERR_ARG);
        CHECK(pld_corpus_add(c, big, 11) == PLD_ERR_ARG);
        CHECK(pld_corpus_add(c, NULL, 1) == PLD_ERR_ARG);
        CHECK(pld_corpus_add(NULL, a, 1) == PLD_ERR_ARG);
        CHECK(pld_corpus_add(c, NULL, 0) == PLD_OK);
        CHECK(pld_corpus_add(c, a, 0) == PLD_OK);
        CHECK(pld_corpus_tokens(c) == 4 && pld_corpus_sequences(c) == 2);
        /* a sequence of max_tokens: everything else goes */
        CHECK(pld_corpus_add(c, big, 10) == PLD_OK);
        CHECK(pld_corpus_tokens(c) == 10 && pld_corpus_sequences(c) == 1);
        CHECK(pld_corpus_evicted(c) == 4 && pld_corpus_max_id(c) == 0);
    }
    /* propose errors */
    CHECK(pld_corpus_propose_tree(c, ctx, 3, 0, 4, NODES, NULL, 0, out, &n) == PLD_ERR_ARG);
    CHECK(n == 0);
    CHECK(pld_corpus_propose_tree(c, ctx, 3, 1, 0, NODES, NULL, 0, out, &n) == PLD_ERR_ARG);
    CHECK(pld_corpus_propose_tree(c, ctx, 3, 1, 17, NODES, NULL, 0, out, &n) == PLD_ERR_ARG);
    CHECK(pld_corpus_propose_tree(c, ctx, 3, 1, 1, PLD_TREE_MAX_NODES + 1, NULL, 0, out, &n) ==
          PLD_ERR_ARG);
    CHECK(pld_corpus_propose_tree(c, NULL, 3, 1, 1, NODES, NULL, 0, out, &n) == PLD_ERR_ARG);
    CHECK(pld_corpus_propose_tree(c, ctx, 3, 1, 1, NODES, NULL, 1, out, &n) == PLD_ERR_ARG);
    CHECK(pld_corpus_propose_tree(c, ctx, 3, 1, 1, NODES, NULL, 0, NULL, &n) == PLD_ERR_ARG);
    CHECK(pld_corpus_propose_tree(NULL, ctx, 3, 1, 1, NODES, NULL, 0, out, &n) == PLD_ERR_ARG);
    CHECK(pld_corpus_propose_tree(c, ctx, 3, 1, 1, NODES, NULL, 0, out, NULL) == PLD_ERR_ARG);
    /* a context with a separator in it looks up only what follows it */
    {
        const int64_t zeros[] = {0, -1, 0, 0};
        n = 99;
        /* "0 0" newest first: before the separator (nothing), then "0", "0 0" */
        CHECK(pld_corpus_propose_tree(c, zeros, 4, 2, 3, NODES, NULL, 0, out, &n) == PLD_OK);
        CHECK(n == 2 && out[0].ngram == 2 && out[1].ngram == 2 && out[0].support == 2);
        CHECK(pld_corpus_propose_tree(c, zeros, 2, 2, 1, NODES, NULL, 0, out, &n) == PLD_OK);
        CHECK(n == 0);
    }
    pld_corpus_clear(c);
    CHECK(pld_corpus_tokens(c) == 0 && pld_corpus_sequences(c) == 0);
    CHECK(pld_corpus_evicted(c) == 4 && pld_corpus_max_id(c) == -1);
    CHECK(pld_corpus_segments_used(c) == 0);
    CHECK(pld_corpus_propose_tree(c, ctx, 3, 4, 4, NODES, NULL, 0, out, &n) == PLD_OK && n == 0);
    CHECK(pld_corpus_add(c, b, 3) == PLD_OK && pld_corpus_tokens(c) == 3);
    pld_corpus_free(c);
}

/* The same adds to pld_corpus and ref_corpus; after each, the counts and
 * sequences agree, and proposals from contexts drawn from held sequences
 * (and random ones) equal the reference's. */
static void test_corpus_random(void)
{
    static pld_tree_node got[NODES], want[NODES];
    static int64_t seqbuf[64];
    int round;
    for (round = 0; round < 400; round++) {
        const size_t min_n = 1 + t_below(3), max_n = min_n + t_below(3);
        const size_t max_tokens = 1 + t_below(120), segments = 1 + t_below(12);
        const size_t vocab = 1 + t_below(6);
        pld_corpus *c = pld_corpus_new(max_tokens, min_n, max_n, segments, t_next());
        ref_corpus r;
        int step;
        ref_corpus_init(&r, max_tokens, min_n, max_n, segments);
        CHECK(c != NULL);
        for (step = 0; step < 40; step++) {
            size_t len = t_below(4) == 0 ? t_below(max_tokens + 3) : t_below(20), k;
            int want_ok;
            pld_status st;
            if (len > 64)
                len = 64;
            for (k = 0; k < len; k++)
                seqbuf[k] = (int64_t)t_below(vocab);
            if (len > 0 && t_below(20) == 0)
                seqbuf[t_below(len)] = -1 - (int64_t)t_below(3);
            want_ok = ref_corpus_add(&r, seqbuf, len) == 0;
            st = pld_corpus_add(c, seqbuf, len);
            CHECKF((st == PLD_OK) == want_ok, "round %d step %d: status %d", round, step, (int)st);
            CHECK(pld_corpus_tokens(c) == r.tokens && pld_corpus_sequences(c) == r.sequences);
            CHECK(pld_corpus_evicted(c) == r.evicted && pld_corpus_segments_used(c) == r.used);
            CHECK(pld_corpus_tokens(c) <= max_tokens && pld_corpus_segments_used(c) <= segments);
            {
                int64_t top = -1;
                size_t i, j;
                for (i = 0; i < r.sequences; i++) {
                    size_t rl, cl = 0;
                    const int64_t *rs = ref_corpus_sequence(&r, i, &rl), *cs = NULL;
                    CHECK(pld_corpus_sequence(c, i, &cs, &cl) == PLD_OK);
                    CHECK(cl == rl && cl >= 1 && memcmp(cs, rs, cl * sizeof(int64_t)) == 0);
                    for (j = 0; j < rl; j++)
                        top = rs[j] > top ? rs[j] : top;
                }
                CHECK(pld_corpus_max_id(c) == top);
            }
            for (k = 0; k < 3; k++) {
                int64_t ctx[10];
                size_t clen = t_below(10), i, n_got = 77, n_want;
                const size_t depth = 1 + t_below(8), per = 1 + t_below(5);
                const size_t max_nodes = t_below(NODES + 1), n_eos = t_below(2);
                const int64_t eos[1] = {(int64_t)t_below(vocab)};
                if (r.sequences > 0 && t_below(3) != 0) {
                    size_t sl;
                    const int64_t *s = ref_corpus_sequence(&r, t_below(r.sequences), &sl);
                    size_t from = t_below(sl), to = from + 1 + t_below(sl - from);
                    clen = to - from < 10 ? to - from : 10;
                    memcpy(ctx, s + to - clen, clen * sizeof(int64_t));
                } else {
                    for (i = 0; i < clen; i++)
                        ctx[i] = (int64_t)t_below(vocab + 1) - (t_below(10) == 0);
                }
                CHECK(pld_corpus_propose_tree(c, ctx, clen, depth, per, max_nodes, eos, n_eos,
                                              got, &n_got) == PLD_OK);
                n_want = ref_corpus_tree(&r, ctx, clen, depth, per, max_nodes, eos, n_eos, want);
                CHECKF(n_got == n_want, "round %d step %d: %zu nodes, want %zu", round, step,
                       n_got, n_want);
                CHECK(ref_trees_equal(got, want, n_got < n_want ? n_got : n_want));
                CHECK(ref_trie_check(got, n_got) == 0);
            }
            if (t_below(60) == 0) {
                pld_corpus_clear(c);
                ref_corpus_clear(&r);
            }
        }
        ref_corpus_clear(&r);
        pld_corpus_free(c);
    }
}

/* pld.h's bound on pld_corpus_nbytes (sizes 2..4). */
static size_t memory_bound(const pld_corpus *c)
{
    return (size_t)PLD_CORPUS_BYTES_PER_TOKEN * (pld_corpus_tokens(c) + pld_corpus_sequences(c)) +
           24576 * pld_corpus_segments_used(c) + 8 * pld_corpus_sequences(c) + 4096;
}

/* ~1M tokens, three times over (eviction turns the corpus over), of
 * text-like ids (Zipf-ish over 49k, with repeated phrases; random ids with
 * `random_ids`): pld.h's memory bound holds after every add. */
static void test_corpus_memory(size_t segments, int random_ids)
{
    const size_t max_tokens = (size_t)1 << 20;
    static int64_t seq[600];
    pld_corpus *c = pld_corpus_new(max_tokens, 2, 4, segments, 99);
    size_t added = 0, worst_x100 = 0, over = 0;
    CHECK(c != NULL);
    while (added < 3 * max_tokens) {
        const size_t len = 50 + t_below(500);
        size_t k;
        for (k = 0; k < len; k++) {
            /* a log-uniform id (heavy head), a repeated phrase now and then */
            const double u = (double)(t_next() >> 11) / 9007199254740992.0;
            const size_t id = random_ids ? t_below(49152) : (size_t)(49152.0 * u * u * u * u);
            if (!random_ids && k >= 8 && k + 4 <= len && t_below(4) == 0) {
                memcpy(seq + k, seq + t_below(k - 7), 4 * sizeof(int64_t));
                k += 3;
                continue;
            }
            seq[k] = (int64_t)id;
        }
        CHECK(pld_corpus_add(c, seq, len) == PLD_OK);
        added += len;
        CHECK(pld_corpus_tokens(c) <= max_tokens);
        over += pld_corpus_nbytes(c) > memory_bound(c);
        if (pld_corpus_tokens(c) >= max_tokens / 2) {
            const size_t x100 = 100 * pld_corpus_nbytes(c) / pld_corpus_tokens(c);
            worst_x100 = x100 > worst_x100 ? x100 : worst_x100;
        }
    }
    printf("corpus memory (%s ids, %zu segments): %.2f bytes per token held at worst, "
           "%zu tokens held, %llu sequences evicted\n",
           random_ids ? "random" : "text-like", segments, (double)worst_x100 / 100.0,
           pld_corpus_tokens(c), (unsigned long long)pld_corpus_evicted(c));
    CHECKF(over == 0, "%zu adds left the corpus above pld.h's memory bound", over);
    CHECK(pld_corpus_evicted(c) > 0);
    pld_corpus_free(c);
}

/* pld_index_continuations_many gives what pld_index_continuations gives,
 * probe by probe, on indexes of every policy mixed in one batch: keys that
 * end the sequence (whose newest occurrence has no continuation), keys
 * found nowhere, sizes longer than the sequence. */
static void test_continuations_many(void)
{
    static int64_t seq[200];
    int round;
    for (round = 0; round < 2000; round++) {
        pld_index *ix[3];
        pld_probe probes[PLD_PROBE_BATCH];
        int64_t keys[PLD_PROBE_BATCH][4];
        const size_t min_n = 1 + t_below(2), max_n = min_n + t_below(3);
        const size_t len = t_below(200), vocab = 1 + t_below(5);
        const size_t count = t_below(PLD_PROBE_BATCH + 1), max = 1 + t_below(PLD_TREE_MAX_PER_NGRAM);
        size_t i, k;
        for (i = 0; i < len; i++)
            seq[i] = (int64_t)t_below(vocab);
        for (k = 0; k < 3; k++) {
            ix[k] = pld_index_new_keyed(min_n, max_n, k == 0 ? PLD_POLICY_RECENT
                                                     : k == 1 ? PLD_POLICY_FIRST : PLD_POLICY_FREQUENT,
                                        t_next());
            CHECK(ix[k] != NULL && pld_index_extend(ix[k], seq, len) == PLD_OK);
        }
        for (i = 0; i < count; i++) {
            pld_probe *p = &probes[i];
            p->index = ix[t_below(4) == 0 ? 1 + t_below(2) : 0];
            p->n = min_n + t_below(max_n - min_n + 1);
            if (len >= p->n && t_below(3) == 0) { /* the sequence's own suffix */
                memcpy(keys[i], seq + len - p->n, p->n * sizeof(int64_t));
            } else if (len >= p->n && t_below(2) == 0) { /* an n-gram in it */
                const size_t at = t_below(len - p->n + 1);
                memcpy(keys[i], seq + at, p->n * sizeof(int64_t));
            } else {
                for (k = 0; k < p->n; k++)
                    keys[i][k] = (int64_t)t_below(vocab + 1);
            }
            p->key = keys[i];
            p->found = 99;
        }
        pld_index_continuations_many(probes, count, max);
        for (i = 0; i < count; i++) {
            size_t want[PLD_TREE_MAX_PER_NGRAM];
            const size_t n_want =
                pld_index_continuations(probes[i].index, probes[i].key, probes[i].n, max, want);
            CHECKF(probes[i].found == n_want, "round %d probe %zu: %zu found, want %zu", round, i,
                   probes[i].found, n_want);
            CHECK(probes[i].found != n_want ||
                  memcmp(probes[i].starts, want, n_want * sizeof(size_t)) == 0);
        }
        for (k = 0; k < 3; k++)
            pld_index_free(ix[k]);
    }
}

/* Two different 2-grams that share a tag under the corpus's key, the
 * later-filed one sitting past the other in the probe run: the batched
 * lookup's first guess (the first slot with the tag) is the wrong n-gram
 * for one of them, and each must still find its own continuations. */
typedef struct {
    uint32_t tag;
    int64_t a, b;
} tagged_pair;

static int by_tag(const void *x, const void *y)
{
    const uint32_t p = ((const tagged_pair *)x)->tag, q = ((const tagged_pair *)y)->tag;
    return (p > q) - (p < q);
}

static void test_corpus_tag_collision(void)
{
    enum { PAIRS = 300000 };
    const uint64_t key = 0x5eedf00dull;
    tagged_pair *pairs = malloc(PAIRS * sizeof(tagged_pair));
    static pld_tree_node got[NODES], want[NODES];
    size_t i, found = 0;
    CHECK(pairs != NULL);
    if (pairs == NULL)
        return;
    for (i = 0; i < PAIRS; i++) {
        int64_t k[2];
        k[0] = pairs[i].a = (int64_t)(i / 1000);
        k[1] = pairs[i].b = (int64_t)(1000 + i % 1000);
        pairs[i].tag = pld_index_ngram_tag(k, 2, key);
    }
    qsort(pairs, PAIRS, sizeof(tagged_pair), by_tag);
    for (i = 0; i + 1 < PAIRS && found < 4; i++) {
        const tagged_pair *x = &pairs[i], *y = &pairs[i + 1];
        int order;
        if (x->tag != y->tag)
            continue;
        found++;
        for (order = 0; order < 2; order++) {
            const tagged_pair *first = order ? y : x, *second = order ? x : y;
            /* first filed, then second (its slot after first's), each with
             * its own continuation */
            const int64_t s1[4] = {first->a, first->b, 7777, 7778};
            const int64_t s2[4] = {second->a, second->b, 8888, 8889};
            pld_corpus *c = pld_corpus_new(100, 2, 2, 2, key);
            ref_corpus r;
            int q;
            ref_corpus_init(&r, 100, 2, 2, 2);
            CHECK(c != NULL && pld_corpus_add(c, s1, 4) == PLD_OK &&
                  pld_corpus_add(c, s2, 4) == PLD_OK);
            CHECK(ref_corpus_add(&r, s1, 4) == 0 && ref_corpus_add(&r, s2, 4) == 0);
            for (q = 0; q < 2; q++) {
                const int64_t ctx[2] = {q ? second->a : first->a, q ? second->b : first->b};
                size_t n_got = 0, n_want;
                CHECK(pld_corpus_propose_tree(c, ctx, 2, 2, 4, NODES, NULL, 0, got, &n_got) ==
                      PLD_OK);
                n_want = ref_corpus_tree(&r, ctx, 2, 2, 4, NODES, NULL, 0, want);
                CHECKF(n_got == n_want && n_got == 2, "collision %zu order %d query %d: %zu nodes",
                       found, order, q, n_got);
                CHECK(ref_trees_equal(got, want, n_got < n_want ? n_got : n_want));
                CHECK(n_got >= 1 && got[0].token == (q ? 8888 : 7777));
            }
            ref_corpus_clear(&r);
            pld_corpus_free(c);
        }
    }
    CHECKF(found >= 1, "no two of %d 2-grams share a tag", (int)PAIRS);
    free(pairs);
}

int main(void)
{
    test_after_hand();
    test_after_errors();
    test_after_random();
    test_corpus_new_errors();
    test_corpus_hand();
    test_corpus_random();
    test_corpus_tag_collision();
    test_continuations_many();
    test_corpus_memory(4, 0);
    test_corpus_memory(1, 1);
    test_corpus_memory(16, 1);
    printf("test_corpus: %ld passed, %ld failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
