/*
 * fuzz_corpus.c -- libFuzzer target: adds and lookups on a pld_corpus with
 * a brute-force shadow (tests/naive_corpus.h), and
 * pld_index_propose_tree_after on three indexes (FIRST, RECENT, FREQUENT)
 * over the concatenation of every sequence added, their tries merged.
 *
 * After every operation: the corpus holds at most max_tokens tokens in at
 * most `segments` segments, and its counts, sequences and largest id are
 * the shadow's. A lookup's trie is well formed (tests/naive_corpus.h,
 * ref_trie_check) and equals the shadow's node for node. Refused adds
 * (negative ids, too long) return PLD_ERR_ARG and change nothing. Aborts
 * on any mismatch.
 *
 * Input layout:
 *   [0] min_n - 1 (mod 3)   [1] max_n - min_n (mod 4)   [2] max_tokens - 1
 *   [3] segments - 1 (mod 6; 0x80: 64)   [4] vocab - 1 (mod 8)
 *   [5..12] the hash key, little-endian
 *   then ops, one byte each plus arguments:
 *     op % 4 in 0..1  add (next byte % 40) tokens from the input; op bit
 *                     0x40: one of them negative, 0x80: longer than
 *                     max_tokens (both refused, as is any longer one)
 *     op % 4 == 2     corpus lookup: a context from a held sequence (or
 *                     from the input with op bit 0x40), options from the
 *                     input
 *     op % 4 == 3     propose_tree_after on the three indexes, merged (op
 *                     bit 0x80: clear the corpus instead)
 */
#include "pld.h"
#include "tests/naive_corpus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEQ_CAP 4096 /* tokens the three indexes take, at most */
#define NODES 64

static const uint8_t *g_data;
static size_t g_size, g_pos;

static int more(void) { return g_pos < g_size; }
static uint8_t next_byte(void) { return g_pos < g_size ? g_data[g_pos++] : 0; }

static void check_counts(const pld_corpus *c, const ref_corpus *r)
{
    int64_t top = -1;
    size_t i, j;
    if (pld_corpus_tokens(c) != r->tokens || pld_corpus_sequences(c) != r->sequences ||
        pld_corpus_evicted(c) != r->evicted || pld_corpus_segments_used(c) != r->used) {
        fprintf(stderr, "counts: tokens %zu/%zu sequences %zu/%zu evicted %llu/%llu\n",
                pld_corpus_tokens(c), r->tokens, pld_corpus_sequences(c), r->sequences,
                (unsigned long long)pld_corpus_evicted(c), (unsigned long long)r->evicted);
        abort();
    }
    if (r->tokens > r->max_tokens || r->used > r->max_segments)
        abort();
    for (i = 0; i < r->sequences; i++) {
        size_t rl, cl = 0;
        const int64_t *rs = ref_corpus_sequence(r, i, &rl), *cs = NULL;
        if (pld_corpus_sequence(c, i, &cs, &cl) != PLD_OK || cl != rl ||
            memcmp(cs, rs, cl * sizeof(int64_t)) != 0)
            abort();
        for (j = 0; j < rl; j++)
            top = rs[j] > top ? rs[j] : top;
    }
    if (pld_corpus_max_id(c) != top || pld_corpus_nbytes(c) == 0)
        abort();
}

static void check_tree(const pld_tree_node *got, size_t n_got, const pld_tree_node *want,
                       size_t n_want, const char *what)
{
    if (n_got != n_want || !ref_trees_equal(got, want, n_got) || ref_trie_check(got, n_got) != 0) {
        fprintf(stderr, "%s: %zu nodes, reference %zu\n", what, n_got, n_want);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int64_t seq[SEQ_CAP];
    static pld_tree_node got[NODES + 1], want[NODES];
    size_t min_n, max_n, max_tokens, segments, vocab, len = 0, p;
    uint64_t key = 0;
    pld_corpus *c;
    pld_index *ix[3];
    ref_corpus r;
    if (size < 13)
        return 0;
    min_n = 1 + data[0] % 3;
    max_n = min_n + data[1] % 4;
    max_tokens = 1 + (size_t)data[2];
    segments = (data[3] & 0x80) ? PLD_CORPUS_MAX_SEGMENTS : 1 + data[3] % 6;
    vocab = 1 + data[4] % 8;
    for (p = 0; p < 8; p++)
        key |= (uint64_t)data[5 + p] << (8 * p);
    g_data = data;
    g_size = size;
    g_pos = 13;
    c = pld_corpus_new(max_tokens, min_n, max_n, segments, key);
    if (c == NULL || pld_corpus_key(c) != key)
        abort();
    ref_corpus_init(&r, max_tokens, min_n, max_n, segments);
    for (p = 0; p < 3; p++)
        if ((ix[p] = pld_index_new_keyed(min_n, max_n, (pld_policy)p, key)) == NULL)
            abort();
    while (more()) {
        const uint8_t op = next_byte();
        switch (op % 4) {
        case 0:
        case 1: {
            int64_t toks[300];
            size_t n = next_byte() % 40, i;
            int refused = 0;
            pld_status st;
            if (op & 0x80) {
                n = max_tokens + 1 + next_byte() % 3;
                refused = 1;
            }
            for (i = 0; i < n; i++)
                toks[i] = (int64_t)(next_byte() % vocab);
            refused |= n > max_tokens;
            if ((op & 0x40) && n > 0) {
                toks[next_byte() % n] = -1 - (int64_t)(next_byte() % 3);
                refused = 1;
            }
            st = pld_corpus_add(c, toks, n);
            if ((st == PLD_OK) == refused || (refused && st != PLD_ERR_ARG))
                abort();
            if (!refused) {
                if (ref_corpus_add(&r, toks, n) != 0)
                    abort();
                for (i = 0; i < n && len < SEQ_CAP; i++)
                    seq[len++] = toks[i];
                for (p = 0; p < 3; p++)
                    if (pld_index_extend(ix[p], toks, i) != PLD_OK)
                        abort();
            }
            break;
        }
        case 2: {
            int64_t ctx[12], eos[1];
            const size_t depth = 1 + next_byte() % 10, per = 1 + next_byte() % 6;
            const size_t max_nodes = next_byte() % (NODES + 1), n_eos = next_byte() % 2;
            size_t clen = next_byte() % 12, i, n_got = 5, n_want;
            eos[0] = (int64_t)(next_byte() % vocab);
            if (r.sequences > 0 && !(op & 0x40)) {
                size_t sl, to;
                const int64_t *s = ref_corpus_sequence(&r, next_byte() % r.sequences, &sl);
                to = 1 + next_byte() % sl;
                clen = clen < to ? clen : to;
                memcpy(ctx, s + to - clen, clen * sizeof(int64_t));
            } else {
                for (i = 0; i < clen; i++)
                    ctx[i] = (int64_t)(next_byte() % (vocab + 1)) - 1;
            }
            got[max_nodes].token = -4242;
            if (pld_corpus_propose_tree(c, ctx, clen, depth, per, max_nodes, eos, n_eos, got,
                                        &n_got) != PLD_OK || got[max_nodes].token != -4242)
                abort();
            n_want = ref_corpus_tree(&r, ctx, clen, depth, per, max_nodes, eos, n_eos, want);
            check_tree(got, n_got, want, n_want, "corpus");
            break;
        }
        default: {
            int64_t ctx[12], eos[1];
            const size_t depth = 1 + next_byte() % 10, per = 1 + next_byte() % 6;
            const size_t max_nodes = next_byte() % (NODES + 1), n_eos = next_byte() % 2;
            size_t clen = next_byte() % 12, i, n_got = 0, n_want = 0;
            if (op & 0x80) {
                pld_corpus_clear(c);
                ref_corpus_clear(&r);
                break;
            }
            eos[0] = (int64_t)(next_byte() % vocab);
            for (i = 0; i < clen; i++)
                ctx[i] = (int64_t)(next_byte() % vocab);
            got[max_nodes].token = -4242;
            for (p = 0; p < 3; p++) { /* each merged into the tries of the others */
                if (pld_index_propose_tree_after(ix[p], ctx, clen, depth, per, max_nodes, eos,
                                                 n_eos, got, &n_got) != PLD_OK ||
                    got[max_nodes].token != -4242)
                    abort();
                n_want = ref_tree_after(seq, len, min_n, max_n, p == PLD_POLICY_RECENT, ctx, clen,
                                        depth, per, max_nodes, eos, n_eos, want, n_want);
                check_tree(got, n_got, want, n_want, "propose_tree_after");
            }
            break;
        }
        }
        check_counts(c, &r);
    }
    ref_corpus_clear(&r);
    pld_corpus_free(c);
    for (p = 0; p < 3; p++)
        pld_index_free(ix[p]);
    return 0;
}
