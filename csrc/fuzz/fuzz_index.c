/*
 * fuzz_index.c -- libFuzzer target: a sequence of extend / truncate /
 * propose operations applied to three indexes (FIRST, RECENT, FREQUENT)
 * over the same sequence, with a shadow copy kept here.
 *
 * After every operation: all three hold the shadow sequence; FIRST
 * proposes exactly what pld_find_candidate_i64 finds; RECENT (also with
 * voters) and FREQUENT agree with the brute-force references of
 * tests/naive_reference.h (while the sequence is short enough for brute
 * force); after ops with bit 0x08,
 * every index's propose_tree equals the brute-force trie (ref_tree), with
 * depth, per_ngram and max_nodes read from the input. Aborts on any
 * mismatch.
 *
 * The indexes are keyed by input bytes (pld_index_new_keyed), and edge
 * operations drive the public entry points with adversarial sizes: counts
 * past PLD_INDEX_MAX_TOKENS (PLD_ERR_OVERFLOW, the index unchanged), NULL
 * and zero-size arguments, k = 0 and large k, ids at the int64 and 2^32
 * boundaries, bad n-gram sizes for pld_index_new, out-of-contract
 * arguments for pld_find_candidate_* (PLD_ERR_ARG).
 *
 * Input layout:
 *   [0] min_n - 1 (mod 4)      [1] max_n - min_n (mod 5; 0x80: max_n 64)
 *   [2] vocab - 1 (mod 6); with bit 0x80: vocab 64 + 16 * (bits 0-5),
 *       each token then read from two bytes (new n-grams are common: the
 *       FIRST index's filter and its ring of n-grams not yet filed fill)
 *                              [3] bits 0-1: eos count, bit 2: large ids
 *   [4..5] eos token indices   [6..13] the hash key, little-endian
 *   then ops, one byte each plus arguments:
 *     op % 8 in 0..3  extend by (next byte % 24) tokens from the input
 *                     (op 1 and 3 via pld_index_extend_i32)
 *     op % 8 == 4     truncate to (next byte) * len / 255
 *     op % 8 == 5     truncate by (next byte % 4)
 *                     (ops 4, 5 with bit 0x40 set: reserve next byte instead;
 *                     op 5 with bits 0x40 and 0x80: an edge operation, the
 *                     next byte picks which, see edge_op)
 *     op % 8 in 6..7  propose with k = next byte % 20, opts from op bits
 */
#include "pld.h"
#include "tests/naive_reference.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAP 2048
#define BRUTE_MAX 300
#define KMAX 4096 /* the largest k an edge operation proposes with */
#define TREE_NODES 64 /* the most nodes a tree check asks for */

static const uint8_t *g_data;
static size_t g_size, g_pos;

static int more(void) { return g_pos < g_size; }
static uint8_t next_byte(void) { return g_pos < g_size ? g_data[g_pos++] : 0; }

static void fail(const char *what, const int64_t *seq, size_t len,
                 size_t min_n, size_t max_n, size_t k,
                 const pld_lookup_opts *o, const int64_t *got, size_t ng,
                 const int64_t *want, size_t nw)
{
    size_t i;
    fprintf(stderr, "%s: min_n=%zu max_n=%zu k=%zu semantics=%d "
            "max_length=%lld n_eos=%zu\nseq[%zu]=", what, min_n, max_n, k,
            (int)o->semantics, (long long)o->max_length, o->n_eos, len);
    for (i = 0; i < len && i < 300; i++)
        fprintf(stderr, "%lld,", (long long)seq[i]);
    fprintf(stderr, "\ngot[%zu]=", ng);
    for (i = 0; i < ng; i++)
        fprintf(stderr, "%lld,", (long long)got[i]);
    fprintf(stderr, "\nwant[%zu]=", nw);
    for (i = 0; i < nw && want; i++)
        fprintf(stderr, "%lld,", (long long)want[i]);
    fprintf(stderr, "\n");
    abort();
}

static void check_all(pld_index *const ix[3], const int64_t *seq, size_t len,
                      size_t min_n, size_t max_n, size_t k,
                      const pld_lookup_opts *o)
{
    int64_t out[40], ref[40];
    size_t p, n, s, c;
    for (p = 0; p < 3; p++) {
        if (pld_index_len(ix[p]) != len ||
            (len && memcmp(pld_index_tokens(ix[p]), seq, len * sizeof *seq)))
            fail("tokens differ", seq, len, min_n, max_n, k, o, NULL, 0, NULL, 0);
    }
    for (n = 0; n < 40; n++)
        out[n] = -4242;
    n = pld_index_propose(ix[0], k, o, out);
    if (out[k] != -4242 || n > k)
        fail("FIRST wrote past k", seq, len, min_n, max_n, k, o, out, n, NULL, 0);
    if (k == 0) {
        if (n != 0)
            fail("FIRST k=0", seq, len, min_n, max_n, k, o, out, n, NULL, 0);
    } else {
        if (pld_find_candidate_i64(seq, len, min_n, max_n, k, o, &s, &c) != PLD_OK)
            abort();
        if (n != c || (c && memcmp(out, seq + s, c * sizeof *out)))
            fail("FIRST != find_candidate", seq, len, min_n, max_n, k, o, out,
                 n, seq + s, c);
    }

    for (n = 0; n < 40; n++)
        out[n] = -4242;
    n = pld_index_propose(ix[1], k, o, out);
    if (out[k] != -4242 || n > k)
        fail("RECENT wrote past k", seq, len, min_n, max_n, k, o, out, n, NULL, 0);
    if (len <= BRUTE_MAX) {
        c = k ? ref_find(seq, len, min_n, max_n, k, o, 1, &s) : 0;
        if (n != c || (c && memcmp(out, seq + s, c * sizeof *out)))
            fail("RECENT != reference", seq, len, min_n, max_n, k, o, out, n,
                 seq + s, c);
    }

    for (n = 0; n < 40; n++)
        out[n] = -4242;
    {   /* RECENT with voters: 2 .. PLD_MAX_VOTERS + 1 (the cap applies) */
        const size_t voters = 2 + (k + len) % PLD_MAX_VOTERS;
        n = pld_index_propose_voted(ix[1], k, voters, o, out, NULL);
        if (out[k] != -4242 || n > k)
            fail("RECENT voted wrote past k", seq, len, min_n, max_n, k, o, out, n, NULL, 0);
        if (len <= BRUTE_MAX && k > 0) {
            c = ref_voted(seq, len, min_n, max_n, k, o,
                          voters < PLD_MAX_VOTERS ? voters : PLD_MAX_VOTERS, ref);
            if (n != c || (c && memcmp(out, ref, c * sizeof *out)))
                fail("RECENT voted != reference", seq, len, min_n, max_n, k, o, out, n, ref, c);
        }
    }

    for (n = 0; n < 40; n++)
        out[n] = -4242;
    n = pld_index_propose(ix[2], k, o, out);
    if (out[k] != -4242 || n > k)
        fail("FREQUENT wrote past k", seq, len, min_n, max_n, k, o, out, n, NULL, 0);
    if (len <= BRUTE_MAX) {
        c = ref_frequent(seq, len, min_n, max_n, k, o, ref);
        if (n != c || (c && memcmp(out, ref, c * sizeof *out)))
            fail("FREQUENT != reference", seq, len, min_n, max_n, k, o, out, n,
                 ref, c);
    }
}

/* propose_tree of every index against the brute-force trie, with the
 * options drawn from the input. */
static void check_trees(pld_index *const ix[3], const int64_t *seq, size_t len,
                        size_t min_n, size_t max_n, const int64_t *eos, size_t n_eos)
{
    static pld_tree_node got[TREE_NODES + 1], want[TREE_NODES];
    const size_t depth = 1 + next_byte() % 12, per_ngram = 1 + next_byte() % 6;
    const size_t max_nodes = next_byte() % (TREE_NODES + 1);
    size_t p, v;
    if (len > BRUTE_MAX)
        return;
    for (p = 0; p < 3; p++) {
        size_t n_got = 99, n_want;
        got[max_nodes].token = -4242;
        if (pld_index_propose_tree(ix[p], depth, per_ngram, max_nodes, eos, n_eos, got,
                                   &n_got) != PLD_OK)
            abort();
        if (got[max_nodes].token != -4242)
            abort(); /* wrote past max_nodes */
        n_want = ref_tree(seq, len, min_n, max_n, p == 1, depth, per_ngram, max_nodes, eos,
                          n_eos, want);
        if (n_got != n_want) {
            fprintf(stderr, "tree: policy %zu: %zu nodes, reference %zu\n", p, n_got, n_want);
            abort();
        }
        for (v = 0; v < n_got; v++)
            if (got[v].token != want[v].token || got[v].parent != want[v].parent ||
                got[v].depth != want[v].depth || got[v].ngram != want[v].ngram ||
                got[v].support != want[v].support) {
                fprintf(stderr, "tree: policy %zu: node %zu differs\n", p, v);
                abort();
            }
    }
}

/* Ids at the boundaries the index treats specially: the int64 extremes,
 * [0, 2^32) (unigram tags that are a bijection), [0, 2^20) (the FIRST
 * index's array of unigrams by id), 2^32 - 1 (its "no predecessor" code),
 * and top-bit differences. */
static const int64_t g_edge_ids[20] = {
    INT64_MIN, INT64_MIN + 1, INT64_MAX, INT64_MAX - 1, -1, 0, 1,
    ((int64_t)1 << 20) - 1, (int64_t)1 << 20, ((int64_t)1 << 31) - 1,
    (int64_t)1 << 31, -((int64_t)1 << 31), ((int64_t)1 << 32) - 2,
    ((int64_t)1 << 32) - 1, (int64_t)1 << 32, ((int64_t)1 << 32) + 1,
    INT64_MIN + ((int64_t)1 << 31), INT64_MIN + 1 + ((int64_t)1 << 31),
    ((int64_t)1 << 62), -((int64_t)1 << 62)};

/* FIRST proposes with a large k into a bounded buffer: no write past k,
 * the one-shot lookup's draft; RECENT: the reference's (brute force while
 * short); FREQUENT: its draft for min(k, 16) (which check_all compares
 * with the reference) is a prefix of the long one. */
static void check_large_k(pld_index *const ix[3], const int64_t *seq, size_t len,
                          size_t min_n, size_t max_n, size_t k,
                          const pld_lookup_opts *o)
{
    static int64_t out[KMAX + 8];
    int64_t small[16];
    size_t p, n, s, c, j;
    for (p = 0; p < 3; p++) {
        for (j = 0; j < k + 8; j++)
            out[j] = -4242;
        n = pld_index_propose(ix[p], k, o, out);
        for (j = k; j < k + 8; j++)
            if (out[j] != -4242)
                fail("wrote past a large k", seq, len, min_n, max_n, k, o, out, n, NULL, 0);
        if (n > k)
            fail("draft longer than k", seq, len, min_n, max_n, k, o, out, n, NULL, 0);
        if (p == 0) {
            if (pld_find_candidate_i64(seq, len, min_n, max_n, k, o, &s, &c) != PLD_OK)
                abort();
        } else if (p == 1) {
            if (len > BRUTE_MAX)
                continue;
            c = ref_find(seq, len, min_n, max_n, k, o, 1, &s);
        } else {
            c = pld_index_propose(ix[2], k < 16 ? k : 16, o, small);
            if (n < c || (c && memcmp(out, small, c * sizeof *out)))
                fail("FREQUENT: k = 16 is not a prefix", seq, len, min_n, max_n, k, o,
                     out, n, small, c);
            continue;
        }
        if (n != c || (c && memcmp(out, seq + s, c * sizeof *out)))
            fail("large k differs", seq, len, min_n, max_n, k, o, out, n, seq + s, c);
    }
}

/* The indexes hold seq[0..len) and nothing changed it. */
static void check_unchanged(pld_index *const ix[3], const int64_t *seq, size_t len,
                            const char *what)
{
    size_t p;
    for (p = 0; p < 3; p++)
        if (pld_index_len(ix[p]) != len ||
            (len && memcmp(pld_index_tokens(ix[p]), seq, len * sizeof *seq))) {
            fprintf(stderr, "%s changed the index\n", what);
            abort();
        }
}

/* One edge operation (sub picks which); returns the new length. */
static size_t edge_op(pld_index *const ix[3], int64_t *seq, size_t len,
                      size_t min_n, size_t max_n, const pld_lookup_opts *o,
                      uint8_t sub)
{
    const size_t room = PLD_INDEX_MAX_TOKENS - len; /* the most a reserve may ask */
    size_t p, i;
    switch (sub % 8) {
    case 0: { /* counts past the limit: PLD_ERR_OVERFLOW, nothing read or changed */
        const size_t huge[8] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - len, SIZE_MAX / 2 + 1,
                                PLD_INDEX_MAX_TOKENS + 1, room + 1,
                                PLD_INDEX_MAX_TOKENS + (size_t)1 + (size_t)UINT32_MAX,
                                len ? PLD_INDEX_MAX_TOKENS : SIZE_MAX / 16};
        const size_t extra = huge[(sub >> 3) % 8];
        int64_t one[1] = {7};
        int32_t one32[1] = {7};
        for (p = 0; p < 3; p++) {
            pld_status a = pld_index_reserve(ix[p], extra);
            pld_status b = pld_index_extend(ix[p], one, extra);
            pld_status c = pld_index_extend_i32(ix[p], one32, extra);
            if (a != PLD_ERR_OVERFLOW || b != PLD_ERR_OVERFLOW || c != PLD_ERR_OVERFLOW) {
                fprintf(stderr, "extra %zu at len %zu: %d %d %d\n", extra, len, a, b, c);
                abort();
            }
        }
        check_unchanged(ix, seq, len, "an overflowing reserve or extend");
        return len;
    }
    case 1: { /* truncate at or beyond the end: a no-op */
        const size_t to[4] = {len, len + 1, SIZE_MAX, PLD_INDEX_MAX_TOKENS};
        for (p = 0; p < 3; p++)
            if (pld_index_truncate(ix[p], to[(sub >> 3) % 4]) != PLD_OK)
                abort();
        check_unchanged(ix, seq, len, "a truncate beyond the end");
        return len;
    }
    case 2: { /* k = 0, NULL out or opts: empty, nothing written */
        int64_t out[2] = {-4242, -4242};
        size_t ngram = 99;
        for (p = 0; p < 3; p++) {
            if (pld_index_propose(ix[p], 0, o, out) != 0 || out[0] != -4242 ||
                pld_index_propose(ix[p], 0, o, NULL) != 0 ||
                pld_index_propose_n(ix[p], 0, o, out, &ngram) != 0 || ngram != 0 ||
                pld_index_propose(ix[p], 2, NULL, out) != 0 || out[0] != -4242 ||
                pld_index_propose(ix[p], 2, o, NULL) != 0)
                abort();
        }
        if (pld_index_propose_n(NULL, 2, o, out, &ngram) != 0 || ngram != 0)
            abort();
        return len;
    }
    case 3: { /* large k into a bounded buffer */
        const size_t ks[4] = {len, len + 1, 2 * len + 3, KMAX};
        size_t k = ks[(sub >> 3) % 4];
        if (k == 0)
            k = 1;
        check_large_k(ix, seq, len, min_n, max_n, k, o);
        return len;
    }
    case 4: { /* zero counts and NULL arguments */
        const int64_t t[1] = {1};
        for (p = 0; p < 3; p++) {
            if (pld_index_extend(ix[p], NULL, 0) != PLD_OK ||
                pld_index_extend(ix[p], t, 0) != PLD_OK ||
                pld_index_extend_i32(ix[p], NULL, 0) != PLD_OK ||
                pld_index_reserve(ix[p], 0) != PLD_OK ||
                pld_index_extend(ix[p], NULL, 1) != PLD_ERR_ARG ||
                pld_index_extend_i32(ix[p], NULL, 3) != PLD_ERR_ARG)
                abort();
        }
        if (pld_index_extend(NULL, t, 1) != PLD_ERR_ARG ||
            pld_index_extend_i32(NULL, NULL, 0) != PLD_ERR_ARG ||
            pld_index_reserve(NULL, 1) != PLD_ERR_ARG ||
            pld_index_truncate(NULL, 0) != PLD_ERR_ARG)
            abort();
        pld_index_free(NULL);
        check_unchanged(ix, seq, len, "a zero-count or NULL call");
        return len;
    }
    case 5: { /* boundary ids, one extend call */
        size_t c = (size_t)(sub >> 3) % 24;
        int64_t chunk[24];
        if (len + c > CAP)
            c = CAP - len;
        for (i = 0; i < c; i++) {
            chunk[i] = g_edge_ids[next_byte() % 20];
            seq[len + i] = chunk[i];
        }
        for (p = 0; p < 3; p++)
            if (pld_index_extend(ix[p], chunk, c) != PLD_OK)
                abort();
        return len + c;
    }
    case 6: { /* n-gram sizes outside 1 <= min_n <= max_n <= PLD_MAX_NGRAM */
        static const size_t bad[10][2] = {
            {0, 0}, {0, 1}, {2, 1}, {1, PLD_MAX_NGRAM + 1}, {PLD_MAX_NGRAM + 1, PLD_MAX_NGRAM + 1},
            {PLD_MAX_NGRAM, PLD_MAX_NGRAM + 1}, {SIZE_MAX, SIZE_MAX}, {1, SIZE_MAX},
            {SIZE_MAX, 1}, {0, SIZE_MAX}};
        const size_t *b = bad[(sub >> 3) % 10];
        const uint64_t key = (uint64_t)sub * 0x9E3779B97F4A7C15ull;
        pld_index *x;
        for (p = 0; p < 3; p++)
            if (pld_index_new(b[0], b[1], (pld_policy)p) != NULL ||
                pld_index_new_keyed(b[0], b[1], (pld_policy)p, key) != NULL)
                abort();
        if (pld_index_new_keyed(1, 2, (pld_policy)3, key) != NULL ||
            pld_index_new_keyed(1, 2, (pld_policy)-1, key) != NULL)
            abort();
        /* the largest sizes are fine */
        x = pld_index_new_keyed((sub & 8) ? 1 : PLD_MAX_NGRAM, PLD_MAX_NGRAM,
                                (pld_policy)(sub % 3), key);
        if (x == NULL || pld_index_key(x) != key || pld_index_max_n(x) != PLD_MAX_NGRAM ||
            pld_index_extend(x, seq, len) != PLD_OK || pld_index_len(x) != len)
            abort();
        pld_index_free(x);
        return len;
    }
    default: { /* find_candidate: bad sizes are PLD_ERR_ARG; a huge k is not */
        static const size_t bad_n[6][2] = {
            {0, 1}, {2, 1}, {1, PLD_MAX_NGRAM + 1}, {PLD_MAX_NGRAM + 1, PLD_MAX_NGRAM + 1},
            {1, SIZE_MAX}, {SIZE_MAX, SIZE_MAX}};
        const size_t *b = bad_n[(sub >> 3) % 6];
        static int32_t seq32[CAP];
        const size_t kbig = SIZE_MAX - (size_t)(sub >> 5);
        size_t s = 0, c = 0, rs, rc;
        for (i = 0; i < len; i++)
            seq32[i] = (int32_t)seq[i]; /* the values do not matter here */
        if (pld_find_candidate_i64(seq, len, b[0], b[1], 1, o, &s, &c) != PLD_ERR_ARG ||
            pld_find_candidate_i32(seq32, len, b[0], b[1], 1, o, &s, &c) != PLD_ERR_ARG ||
            pld_find_candidate_i64(seq, len, min_n, max_n, 0, o, &s, &c) != PLD_ERR_ARG ||
            pld_find_candidate_i32(seq32, len, min_n, max_n, 0, o, &s, &c) != PLD_ERR_ARG ||
            pld_find_candidate_i64(seq, len, min_n, max_n, 1, NULL, &s, &c) != PLD_ERR_ARG ||
            pld_find_candidate_i64(seq, len, min_n, max_n, 1, o, NULL, &c) != PLD_ERR_ARG ||
            pld_find_candidate_i32(seq32, len, min_n, max_n, 1, o, &s, NULL) != PLD_ERR_ARG)
            abort();
        if (pld_find_candidate_i64(seq, len, min_n, max_n, kbig, o, &s, &c) != PLD_OK)
            abort();
        if (c > len || s + c > len)
            fail("huge k: draft past the end", seq, len, min_n, max_n, kbig, o, seq + s,
                 c, NULL, 0);
        if (len <= BRUTE_MAX) {
            rc = ref_find(seq, len, min_n, max_n, kbig, o, 0, &rs);
            if (c != rc || (c && s != rs))
                fail("huge k differs", seq, len, min_n, max_n, kbig, o, seq + s, c,
                     seq + rs, rc);
        }
        return len;
    }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int64_t seq[CAP];
    pld_index *ix[3];
    size_t min_n, max_n, vocab, len = 0, p;
    int64_t eos[2];
    int big;
    pld_lookup_opts o;
    uint64_t key = 0;
    if (size < 14)
        return 0;
    min_n = 1 + data[0] % 4;
    max_n = (data[1] & 0x80) ? PLD_MAX_NGRAM : min_n + data[1] % 5;
    vocab = (data[2] & 0x80) ? 64 + 16 * (size_t)(data[2] & 0x3f) : 1 + data[2] % 6;
    big = (data[3] & 4) != 0;
    memset(&o, 0, sizeof o);
    o.n_eos = data[3] & 3;
    if (o.n_eos > 2)
        o.n_eos = 2;
    eos[0] = data[4] % vocab;
    eos[1] = data[5] % vocab;
    if (big) {
        eos[0] = (int32_t)((uint32_t)eos[0] * 0x9E3779B1u);
        eos[1] = (int32_t)((uint32_t)eos[1] * 0x9E3779B1u);
    }
    o.eos = eos;
    for (p = 0; p < 8; p++)
        key |= (uint64_t)data[6 + p] << (8 * p);
    g_data = data;
    g_size = size;
    g_pos = 14;
    for (p = 0; p < 3; p++) {
        ix[p] = pld_index_new_keyed(min_n, max_n, (pld_policy)p, key);
        if (ix[p] == NULL || pld_index_key(ix[p]) != key)
            abort();
    }
    while (more()) {
        uint8_t op = next_byte();
        size_t k = 0, i;
        switch (op % 8) {
        case 0: case 1: case 2: case 3: {
            size_t c = next_byte() % 24;
            int64_t chunk[24];
            int32_t chunk32[24];
            if (len + c > CAP)
                c = CAP - len;
            for (i = 0; i < c; i++) {
                uint32_t raw = next_byte();
                int32_t v;
                if (vocab > 256)
                    raw |= (uint32_t)next_byte() << 8;
                v = (int32_t)(raw % vocab);
                if (big)
                    v = (int32_t)((uint32_t)v * 0x9E3779B1u);
                chunk32[i] = v;
                chunk[i] = v;
                seq[len + i] = v;
            }
            for (p = 0; p < 3; p++) {
                pld_status st = (op & 1) ? pld_index_extend_i32(ix[p], chunk32, c)
                                         : pld_index_extend(ix[p], chunk, c);
                if (st != PLD_OK)
                    abort();
            }
            len += c;
            break;
        }
        case 4: case 5: {
            uint8_t b = next_byte();
            if (op % 8 == 5 && (op & 0xc0) == 0xc0) {
                /* opts as set by the previous op */
                len = edge_op(ix, seq, len, min_n, max_n, &o, b);
                break;
            }
            if (op & 0x40) {
                for (p = 0; p < 3; p++)
                    if (pld_index_reserve(ix[p], b) != PLD_OK)
                        abort();
                break;
            }
            size_t nl = (op % 8 == 4) ? len * b / 255 : (len > b % 4 ? len - b % 4 : 0);
            if (op & 0x80)
                nl = len + b; /* beyond the end: a no-op */
            for (p = 0; p < 3; p++)
                if (pld_index_truncate(ix[p], nl) != PLD_OK)
                    abort();
            if (nl < len)
                len = nl;
            break;
        }
        default:
            k = next_byte() % 20;
            break;
        }
        /* After every op: check under the op's chosen opts (k = 4 when the
         * op was not a propose). */
        if (op % 8 < 6)
            k = 1 + op % 6;
        o.semantics = (op & 0x10) ? PLD_TRANSFORMERS : PLD_SEED;
        switch (op >> 5 & 3) {
        case 0: o.max_length = -1; break;
        case 1: o.max_length = (int64_t)len + 1; break;
        case 2: o.max_length = (int64_t)len + (op & 8 ? 3 : -2); break;
        default: o.max_length = (int64_t)(op & 8); break;
        }
        check_all(ix, seq, len, min_n, max_n, k, &o);
        if (op & 0x08)
            check_trees(ix, seq, len, min_n, max_n, eos, o.n_eos);
    }
    for (p = 0; p < 3; p++) {
        if (pld_index_nbytes(ix[p]) == 0 && len > 0)
            abort();
        pld_index_free(ix[p]);
    }
    return 0;
}
