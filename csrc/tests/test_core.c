/*
 * test_core.c -- plain C tests of the pld core (no framework).
 *
 * Every CHECK counts one passed or failed assertion; the program ends with
 * "test_core: N passed, M failed" and exits nonzero if M > 0. The naive
 * references (naive_reference.h) follow the text of pld.h literally
 * (quadratic and worse); the core must agree with them on every stream we
 * throw at it.
 */
#include "pld.h"
#include "check.h"
#include "naive_reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_seq(const char *name, const int64_t *t, size_t len)
{
    size_t i;
    fprintf(stderr, "  %s[%zu] = {", name, len);
    for (i = 0; i < len; i++)
        fprintf(stderr, "%s%lld", i ? "," : "", (long long)t[i]);
    fprintf(stderr, "}\n");
}

static void print_opts(const pld_lookup_opts *o)
{
    size_t e;
    fprintf(stderr, "  opts: semantics=%d max_length=%lld eos={",
            (int)o->semantics, (long long)o->max_length);
    for (e = 0; e < o->n_eos; e++)
        fprintf(stderr, "%s%lld", e ? "," : "", (long long)o->eos[e]);
    fprintf(stderr, "}\n");
}

/* ---------------------------------------------------------- lookup tests */

static pld_lookup_opts seed_opts(void)
{
    pld_lookup_opts o;
    memset(&o, 0, sizeof o);
    o.semantics = PLD_SEED;
    o.max_length = -1;
    return o;
}

static pld_lookup_opts tf_opts(int64_t max_length, const int64_t *eos,
                               size_t n_eos)
{
    pld_lookup_opts o;
    memset(&o, 0, sizeof o);
    o.semantics = PLD_TRANSFORMERS;
    o.max_length = max_length;
    o.eos = eos;
    o.n_eos = n_eos;
    return o;
}

/* Run both widths on t and return count (start via *start); checks that
 * i32 agrees with i64. Tokens must fit in int32. */
static size_t find_both(const int64_t *t, size_t len, size_t min_n,
                        size_t max_n, size_t k, const pld_lookup_opts *o,
                        size_t *start)
{
    int32_t t32[512];
    size_t s64 = 99, c64 = 99, s32 = 99, c32 = 99, i;
    pld_status r64, r32;
    if (len > 512)
        abort();
    for (i = 0; i < len; i++)
        t32[i] = (int32_t)t[i];
    r64 = pld_find_candidate_i64(t, len, min_n, max_n, k, o, &s64, &c64);
    r32 = pld_find_candidate_i32(t32, len, min_n, max_n, k, o, &s32, &c32);
    CHECK(r64 == PLD_OK);
    CHECK(r32 == PLD_OK);
    CHECK(c64 == c32);
    CHECK(c64 == 0 || s64 == s32);
    *start = s64;
    return c64;
}

static void test_lookup_hand(void)
{
    size_t s, c;
    pld_lookup_opts so = seed_opts();
    pld_lookup_opts to = tf_opts(-1, NULL, 0);

    {   /* a b c d a b -> suffix "a b" at 0, draft "c d" */
        const int64_t t[] = {1, 2, 3, 4, 1, 2};
        c = find_both(t, 6, 1, 2, 2, &so, &s);
        CHECK(c == 2 && s == 2);
        /* k = 3 does not fit under SEED with n = 2: i+n+k = 5 <= 6 fits */
        c = find_both(t, 6, 1, 2, 3, &so, &s);
        CHECK(c == 3 && s == 2);
        /* k = 5: 0+2+5 > 6 for n=2; n=1 suffix "2" at 1: 1+1+5 > 6 */
        c = find_both(t, 6, 1, 2, 5, &so, &s);
        CHECK(c == 0);
        /* TRANSFORMERS clips the continuation instead */
        c = find_both(t, 6, 1, 2, 5, &to, &s);
        CHECK(c == 4 && s == 2);
        /* min_n = 3: suffix "4 1 2" occurs only at its own place */
        c = find_both(t, 6, 3, 3, 2, &so, &s);
        CHECK(c == 0);
        c = find_both(t, 6, 3, 3, 2, &to, &s);
        CHECK(c == 0);
    }
    {   /* the trailing self-match: a a a, SEED n=1: earliest i=0, 0+1 < 2 */
        const int64_t t[] = {7, 7, 7};
        c = find_both(t, 3, 1, 1, 1, &so, &s);
        CHECK(c == 1 && s == 1);
        /* n = 2 earliest i = 0: i + n = 2 < len - n = 1 fails; n=1 ok */
        c = find_both(t, 3, 1, 2, 1, &so, &s);
        CHECK(c == 1 && s == 1);
        /* k = 2: n = 1, i = 0: 0+1+2 <= 3 ok */
        c = find_both(t, 3, 1, 2, 2, &so, &s);
        CHECK(c == 2 && s == 1);
        /* TRANSFORMERS, n from min(2, L-1=2): i = 0, start 2 < end 3 */
        c = find_both(t, 3, 1, 2, 4, &to, &s);
        CHECK(c == 1 && s == 2);
    }
    {   /* length 0 and 1 */
        const int64_t t[] = {5};
        c = find_both(t, 0, 1, 3, 2, &so, &s);
        CHECK(c == 0);
        c = find_both(t, 0, 1, 3, 2, &to, &s);
        CHECK(c == 0);
        c = find_both(t, 1, 1, 3, 2, &so, &s);
        CHECK(c == 0);
        c = find_both(t, 1, 1, 3, 2, &to, &s);
        CHECK(c == 0);
    }
    {   /* earliest occurrence, not the latest: x 1 A x 2 B x -> "1 A" */
        const int64_t t[] = {9, 1, 10, 9, 2, 11, 9};
        c = find_both(t, 7, 1, 3, 2, &so, &s);
        CHECK(c == 2 && s == 1);
        c = find_both(t, 7, 1, 3, 2, &to, &s);
        CHECK(c == 2 && s == 1);
    }
    {   /* max_length and eos under TRANSFORMERS */
        const int64_t t[] = {1, 2, 3, 4, 5, 1, 2};
        const int64_t eos4[] = {4};
        const int64_t eos3[] = {8, 3};
        pld_lookup_opts o;
        o = tf_opts(8, NULL, 0); /* max_length == L + 1 -> empty */
        c = find_both(t, 7, 1, 2, 3, &o, &s);
        CHECK(c == 0);
        o = tf_opts(9, NULL, 0);
        c = find_both(t, 7, 1, 2, 3, &o, &s);
        CHECK(c == 3 && s == 2);
        o = tf_opts(4, NULL, 0); /* end = min(5, 7, 4) = 4: draft "3 4" */
        c = find_both(t, 7, 1, 2, 3, &o, &s);
        CHECK(c == 2 && s == 2);
        o = tf_opts(2, NULL, 0); /* start 2 >= end 2: n=1 "2" at 1 too */
        c = find_both(t, 7, 1, 2, 3, &o, &s);
        CHECK(c == 0);
        o = tf_opts(-1, eos4, 1); /* 3 4 5 cut before 4 */
        c = find_both(t, 7, 1, 2, 3, &o, &s);
        CHECK(c == 1 && s == 2);
        o = tf_opts(-1, eos3, 2); /* cut to nothing: empty, no smaller n */
        c = find_both(t, 7, 1, 2, 3, &o, &s);
        CHECK(c == 0);
        /* eos ignored under SEED */
        o = seed_opts();
        o.eos = eos3;
        o.n_eos = 2;
        c = find_both(t, 7, 1, 2, 3, &o, &s);
        CHECK(c == 3 && s == 2);
    }
    {   /* larger n preferred over an earlier smaller-n match */
        const int64_t t[] = {2, 50, 1, 2, 60, 61, 1, 2};
        c = find_both(t, 8, 1, 2, 2, &so, &s);
        CHECK(c == 2 && s == 4);
        c = find_both(t, 8, 1, 1, 2, &so, &s);
        CHECK(c == 2 && s == 1);
    }
    {   /* int32 extremes and int64 values that alias when truncated */
        const int32_t a32[] = {INT32_MIN, INT32_MAX, -1, INT32_MIN};
        const int64_t a64[] = {(int64_t)1 << 32, 5, 6, 0};
        pld_status r;
        r = pld_find_candidate_i32(a32, 4, 1, 1, 2, &so, &s, &c);
        CHECK(r == PLD_OK && c == 2 && s == 1);
        /* 1<<32 and 0 differ as int64: no draft */
        r = pld_find_candidate_i64(a64, 4, 1, 1, 1, &so, &s, &c);
        CHECK(r == PLD_OK && c == 0);
    }
}

static void test_lookup_errors(void)
{
    const int64_t t[] = {1, 2, 1};
    const int32_t t32[] = {1, 2, 1};
    pld_lookup_opts o = seed_opts();
    size_t s, c;
    CHECK(pld_find_candidate_i64(t, 3, 0, 2, 1, &o, &s, &c) == PLD_ERR_ARG);
    CHECK(pld_find_candidate_i64(t, 3, 3, 2, 1, &o, &s, &c) == PLD_ERR_ARG);
    CHECK(pld_find_candidate_i64(t, 3, 1, 2, 0, &o, &s, &c) == PLD_ERR_ARG);
    CHECK(pld_find_candidate_i64(t, 3, 1, 2, 1, NULL, &s, &c) == PLD_ERR_ARG);
    CHECK(pld_find_candidate_i32(t32, 3, 0, 2, 1, &o, &s, &c) == PLD_ERR_ARG);
    CHECK(pld_find_candidate_i32(t32, 3, 3, 2, 1, &o, &s, &c) == PLD_ERR_ARG);
    CHECK(pld_find_candidate_i32(t32, 3, 1, 2, 0, &o, &s, &c) == PLD_ERR_ARG);
    CHECK(pld_find_candidate_i32(t32, 3, 1, 2, 1, NULL, &s, &c) == PLD_ERR_ARG);
    CHECK(pld_find_candidate_i64(t, 3, 1, 2, 1, &o, &s, &c) == PLD_OK);
}

static void random_opts(pld_lookup_opts *o, int64_t *eos, size_t len,
                        size_t vocab)
{
    size_t e;
    if (t_below(2)) {
        *o = seed_opts();
        return;
    }
    *o = tf_opts(-1, eos, 0);
    switch (t_below(4)) {
    case 0: o->max_length = -1; break;
    case 1: o->max_length = (int64_t)len + 1; break;
    default: o->max_length = (int64_t)t_below(len + 8); break;
    }
    o->n_eos = t_below(3);
    for (e = 0; e < o->n_eos; e++)
        eos[e] = (int64_t)t_below(vocab + 1);
}

static void test_lookup_random(void)
{
    int64_t t[200], eos[4];
    int32_t t32[200];
    int iter;
    for (iter = 0; iter < 20000; iter++) {
        size_t vocab = 1 + t_below(iter % 3 == 0 ? 2 : 6);
        size_t len = t_below(iter % 10 == 0 ? 200 : 40);
        size_t min_n = 1 + t_below(4), max_n = min_n + t_below(5);
        size_t k = 1 + t_below(8), i, rs, rc, s64, c64, s32, c32;
        pld_lookup_opts o;
        pld_status r64, r32;
        for (i = 0; i < len; i++) {
            t[i] = (int64_t)t_below(vocab);
            t32[i] = (int32_t)t[i];
        }
        random_opts(&o, eos, len, vocab);
        rc = ref_find(t, len, min_n, max_n, k, &o, 0, &rs);
        r64 = pld_find_candidate_i64(t, len, min_n, max_n, k, &o, &s64, &c64);
        r32 = pld_find_candidate_i32(t32, len, min_n, max_n, k, &o, &s32, &c32);
        CHECK(r64 == PLD_OK && r32 == PLD_OK);
        CHECKF(c64 == rc && (rc == 0 || s64 == rs),
               "i64 got (%zu,%zu) want (%zu,%zu) n=[%zu,%zu] k=%zu", s64, c64,
               rs, rc, min_n, max_n, k);
        CHECKF(c32 == rc && (rc == 0 || s32 == rs),
               "i32 got (%zu,%zu) want (%zu,%zu) n=[%zu,%zu] k=%zu", s32, c32,
               rs, rc, min_n, max_n, k);
        if ((c64 != rc || (rc && s64 != rs)) && g_failed <= 50) {
            print_seq("t", t, len);
            print_opts(&o);
        }
    }
}

/* k near SIZE_MAX is within the contract: under PLD_SEED no occurrence has
 * room for it (i + n + k must not wrap), under PLD_TRANSFORMERS the draft
 * runs to the end. FIRST and RECENT indexes agree; their drafts are at most
 * len tokens, so a buffer of len tokens holds them. */
static void test_lookup_huge_k(void)
{
    int iter;
    for (iter = 0; iter < 2000; iter++) {
        const size_t ks[4] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX / 2 + 1, SIZE_MAX - 3};
        const size_t len = 1 + t_below(30), min_n = 1 + t_below(2);
        const size_t max_n = min_n + t_below(3), k = ks[t_below(4)];
        int64_t t[32], eos[4], out[32];
        size_t i, s = 99, c = 99, rs, rc, p;
        pld_lookup_opts o;
        for (i = 0; i < len; i++)
            t[i] = (int64_t)t_below(3);
        random_opts(&o, eos, len, 3);
        rc = ref_find(t, len, min_n, max_n, k, &o, 0, &rs);
        CHECK(pld_find_candidate_i64(t, len, min_n, max_n, k, &o, &s, &c) == PLD_OK);
        CHECKF(c == rc && (c == 0 || s == rs) && c <= len,
               "k=%zu got (%zu,%zu) want (%zu,%zu)", k, s, c, rs, rc);
        for (p = 0; p < 2; p++) {
            pld_index *ix = pld_index_new_keyed(min_n, max_n, (pld_policy)p, t_next());
            size_t n;
            if (ix == NULL)
                abort();
            CHECK(pld_index_extend(ix, t, len) == PLD_OK);
            rc = ref_find(t, len, min_n, max_n, k, &o, (int)p, &rs);
            n = pld_index_propose(ix, k, &o, out);
            CHECKF(n == rc && (n == 0 || memcmp(out, t + rs, n * sizeof *out) == 0),
                   "policy %zu k=%zu: %zu tokens, want %zu", p, k, n, rc);
            pld_index_free(ix);
        }
    }
}

/* ----------------------------------------------------------- index tests */

static void test_index_new_errors(void)
{
    pld_index *ix;
    CHECK(pld_index_new(0, 1, PLD_POLICY_FIRST) == NULL);
    CHECK(pld_index_new(3, 2, PLD_POLICY_FIRST) == NULL);
    CHECK(pld_index_new(1, PLD_MAX_NGRAM + 1, PLD_POLICY_FIRST) == NULL);
    CHECK(pld_index_new(1, 2, (pld_policy)3) == NULL);
    CHECK(pld_index_new(1, 2, (pld_policy)-1) == NULL);
    pld_index_free(NULL);
    ix = pld_index_new(1, PLD_MAX_NGRAM, PLD_POLICY_FREQUENT);
    CHECK(ix != NULL);
    if (ix) {
        CHECK(pld_index_min_n(ix) == 1);
        CHECK(pld_index_max_n(ix) == PLD_MAX_NGRAM);
        CHECK(pld_index_policy(ix) == PLD_POLICY_FREQUENT);
        CHECK(pld_index_len(ix) == 0);
    }
    pld_index_free(ix);
    ix = pld_index_new(PLD_MAX_NGRAM, PLD_MAX_NGRAM, PLD_POLICY_RECENT);
    CHECK(ix != NULL);
    CHECK(ix == NULL || pld_index_key(ix) == 0); /* pld_index_new: key 0 */
    pld_index_free(ix);
    CHECK(pld_index_new_keyed(0, 1, PLD_POLICY_FIRST, 5) == NULL);
    CHECK(pld_index_new_keyed(3, 2, PLD_POLICY_RECENT, 5) == NULL);
    CHECK(pld_index_new_keyed(1, PLD_MAX_NGRAM + 1, PLD_POLICY_FREQUENT, 5) == NULL);
    CHECK(pld_index_new_keyed(1, 2, (pld_policy)3, 5) == NULL);
    ix = pld_index_new_keyed(2, 4, PLD_POLICY_FIRST, 0xFEDCBA9876543210ull);
    CHECK(ix != NULL);
    if (ix) {
        CHECK(pld_index_key(ix) == 0xFEDCBA9876543210ull);
        CHECK(pld_index_min_n(ix) == 2 && pld_index_max_n(ix) == 4);
    }
    pld_index_free(ix);
}

/* Compare one index against the references on the sequence it holds. */
static int check_index(pld_index *ix, const int64_t *shadow, size_t len,
                       size_t min_n, size_t max_n, size_t k,
                       const pld_lookup_opts *o)
{
    int64_t out[72], ref[72];
    size_t n, rn = 0, rs = 0, j;
    pld_policy pol = pld_index_policy(ix);
    int ok = 1;
    for (j = 0; j < k + 8 && j < 72; j++)
        out[j] = -777;
    {
        /* pld_index_propose_n: the same draft, and the match size behind it */
        int64_t again[72];
        size_t ngram = 99, n2 = pld_index_propose_n(ix, k, o, again, &ngram);
        n = pld_index_propose(ix, k, o, out);
        ok &= n2 == n && (n == 0 || memcmp(again, out, n * sizeof *out) == 0);
        ok &= n == 0 ? ngram == 0 : (ngram >= min_n && ngram <= max_n);
    }
    ok &= n <= k;
    for (j = n; j < k + 8 && j < 72; j++)
        if (j >= k)
            ok &= out[j] == -777; /* nothing written past out[k-1] */
    if (k == 0) {
        ok &= n == 0; /* find_candidate would say PLD_ERR_ARG */
    } else if (pol == PLD_POLICY_FIRST) {
        size_t s, c;
        pld_status r = pld_find_candidate_i64(shadow, len, min_n, max_n, k, o,
                                              &s, &c);
        ok &= r == PLD_OK && n == c;
        if (ok && c)
            ok &= memcmp(out, shadow + s, c * sizeof *out) == 0;
        rn = ref_find(shadow, len, min_n, max_n, k, o, 0, &rs);
        if (ok)
            ok &= n == rn && (rn == 0 || memcmp(out, shadow + rs,
                                                rn * sizeof *out) == 0);
    } else if (pol == PLD_POLICY_RECENT) {
        rn = ref_find(shadow, len, min_n, max_n, k, o, 1, &rs);
        ok &= n == rn;
        if (ok && rn)
            ok &= memcmp(out, shadow + rs, rn * sizeof *out) == 0;
        {
            /* pld_index_propose_voted: voters 1 is the same draft; more vote */
            const size_t voters = 1 + (k + len) % (PLD_MAX_VOTERS + 2); /* beyond the cap too */
            int64_t voted[72], want[72];
            size_t ngram = 99, got_n, want_n;
            for (j = 0; j < 72; j++)
                voted[j] = -777;
            got_n = pld_index_propose_voted(ix, k, voters, o, voted, &ngram);
            want_n = ref_voted(shadow, len, min_n, max_n, k, o,
                               voters < PLD_MAX_VOTERS ? voters : PLD_MAX_VOTERS, want);
            ok &= got_n == want_n && (got_n == 0 || memcmp(voted, want, got_n * sizeof *want) == 0);
            ok &= got_n == 0 ? ngram == 0 : (ngram >= min_n && ngram <= max_n);
            for (j = k; j < 72; j++)
                ok &= voted[j] == -777; /* nothing written past out[k-1] */
            CHECKF(ok, "voted: voters=%zu n=[%zu,%zu] k=%zu: got %zu tokens, ref %zu", voters, min_n,
                   max_n, k, got_n, want_n);
            if (voters == 1)
                ok &= got_n == n && (n == 0 || memcmp(voted, out, n * sizeof *out) == 0);
        }
    } else {
        rn = ref_frequent(shadow, len, min_n, max_n, k, o, ref);
        ok &= n == rn;
        if (ok && rn)
            ok &= memcmp(out, ref, rn * sizeof *out) == 0;
    }
    CHECKF(ok, "policy %d n=[%zu,%zu] k=%zu: got %zu tokens, ref %zu",
           (int)pol, min_n, max_n, k, n, rn);
    if (!ok && g_failed <= 50) {
        print_seq("seq", shadow, len);
        print_seq("got", out, n);
        if (pol == PLD_POLICY_FREQUENT)
            print_seq("want", ref, rn);
        else
            print_seq("want", shadow + rs, rn);
        print_opts(o);
    }
    {
        /* the token tree: every node as the brute-force trie has it */
        pld_tree_node got[33], want[32];
        const size_t depth = 1 + k % 12, per_ngram = 1 + (k + len) % 5, max_nodes = (k * 7) % 33;
        const int64_t eos = (int64_t)(k % 5);
        size_t n_got = 0, n_want, v;
        int same;
        got[max_nodes].token = -777;
        CHECK(pld_index_propose_tree(ix, depth, per_ngram, max_nodes, &eos, k % 2, got,
                                     &n_got) == PLD_OK);
        CHECK(got[max_nodes].token == -777);
        n_want = ref_tree(shadow, len, min_n, max_n, pol == PLD_POLICY_RECENT, depth, per_ngram,
                          max_nodes, &eos, k % 2, want);
        same = n_got == n_want;
        for (v = 0; same && v < n_got; v++)
            same = got[v].token == want[v].token && got[v].parent == want[v].parent &&
                   got[v].depth == want[v].depth && got[v].ngram == want[v].ngram &&
                   got[v].support == want[v].support;
        CHECKF(same, "tree: policy %d n=[%zu,%zu] depth=%zu per_ngram=%zu max_nodes=%zu: "
               "%zu nodes, ref %zu", (int)pol, min_n, max_n, depth, per_ngram, max_nodes,
               n_got, n_want);
        ok &= same;
    }
    return ok;
}

static void test_index_hand(void)
{
    pld_lookup_opts so = seed_opts();
    int64_t out[8];
    size_t n;
    {   /* RECENT picks the latest valid occurrence */
        const int64_t t[] = {9, 1, 10, 9, 2, 11, 9};
        pld_index *ix = pld_index_new(1, 3, PLD_POLICY_RECENT);
        CHECK(ix != NULL);
        CHECK(pld_index_extend(ix, t, 7) == PLD_OK);
        n = pld_index_propose(ix, 2, &so, out);
        CHECK(n == 2 && out[0] == 2 && out[1] == 11);
        /* k = 3: the 9 at 3 still has room (3 + 1 + 3 <= 7) */
        n = pld_index_propose(ix, 3, &so, out);
        CHECK(n == 3 && out[0] == 2 && out[1] == 11 && out[2] == 9);
        /* k = 4: only the 9 at 0 has room for 4 tokens */
        n = pld_index_propose(ix, 4, &so, out);
        CHECK(n == 4 && out[0] == 1 && out[1] == 10 && out[2] == 9 &&
              out[3] == 2);
        CHECK(pld_index_propose(ix, 0, &so, out) == 0);
        pld_index_free(ix);
    }
    {   /* FREQUENT: after 5 -> 6 twice, 7 once: 6; then 6 -> 5 */
        const int64_t t[] = {5, 7, 5, 6, 5, 6, 8, 5};
        pld_index *ix = pld_index_new(1, 1, PLD_POLICY_FREQUENT);
        CHECK(ix != NULL);
        CHECK(pld_index_extend(ix, t, 8) == PLD_OK);
        n = pld_index_propose(ix, 3, &so, out);
        CHECK(n == 3 && out[0] == 6 && out[1] == 5 && out[2] == 6);
        pld_index_free(ix);
    }
    {   /* FREQUENT tie: followers of 1 are 3, 2, 2, 3: 2 reached 2 first */
        const int64_t t[] = {1, 3, 1, 2, 1, 2, 1, 3, 1};
        pld_index *ix = pld_index_new(1, 1, PLD_POLICY_FREQUENT);
        CHECK(pld_index_extend(ix, t, 9) == PLD_OK);
        n = pld_index_propose(ix, 1, &so, out);
        CHECK(n == 1 && out[0] == 2);
        pld_index_free(ix);
    }
    {   /* FREQUENT stops when no n-gram has a follower */
        const int64_t t[] = {1, 2, 3};
        pld_index *ix = pld_index_new(1, 2, PLD_POLICY_FREQUENT);
        CHECK(pld_index_extend(ix, t, 3) == PLD_OK);
        n = pld_index_propose(ix, 4, &so, out);
        CHECK(n == 0);
        pld_index_free(ix);
    }
    {   /* extend_i32 == extend; accessors; truncate beyond len is a no-op */
        const int32_t t32[] = {4, -3, 4, 100000, 4};
        const int64_t t64[] = {4, -3, 4, 100000, 4};
        pld_index *a = pld_index_new(1, 2, PLD_POLICY_FIRST);
        pld_index *b = pld_index_new(1, 2, PLD_POLICY_FIRST);
        CHECK(pld_index_extend_i32(a, t32, 5) == PLD_OK);
        CHECK(pld_index_extend(b, t64, 5) == PLD_OK);
        CHECK(pld_index_len(a) == 5 && pld_index_len(b) == 5);
        CHECK(memcmp(pld_index_tokens(a), t64, sizeof t64) == 0);
        CHECK(pld_index_nbytes(a) >= 5 * sizeof(int64_t));
        CHECK(pld_index_truncate(a, 99) == PLD_OK && pld_index_len(a) == 5);
        CHECK(pld_index_extend(a, t64, 0) == PLD_OK && pld_index_len(a) == 5);
        n = pld_index_propose(a, 2, &so, out);
        CHECK(n == 2 && out[0] == -3 && out[1] == 4);
        CHECK(pld_index_truncate(a, 0) == PLD_OK && pld_index_len(a) == 0);
        CHECK(pld_index_propose(a, 2, &so, out) == 0);
        pld_index_free(a);
        pld_index_free(b);
    }
}

/* Grow / truncate / propose random streams on all three policies. */
static void test_index_random(void)
{
    int iter;
    for (iter = 0; iter < 600; iter++) {
        size_t min_n = 1 + t_below(3), max_n = min_n + t_below(4);
        size_t vocab = 1 + t_below(iter % 4 == 0 ? 2 : 5);
        size_t cap = 120, len = 0, step, p;
        int64_t shadow[200], eos[4];
        pld_index *ix[3];
        for (p = 0; p < 3; p++) {
            ix[p] = pld_index_new(min_n, max_n, (pld_policy)p);
            CHECK(ix[p] != NULL);
        }
        if (!ix[0] || !ix[1] || !ix[2])
            abort();
        for (step = 0; step < 40; step++) {
            size_t op = t_below(10), i;
            if (op < 7 && len < cap) { /* extend by a chunk */
                size_t c = t_below(op == 0 ? 12 : 4) + (op == 1);
                int64_t chunk[16];
                int32_t chunk32[16];
                if (len + c > cap)
                    c = cap - len;
                for (i = 0; i < c; i++) {
                    chunk[i] = (int64_t)t_below(vocab);
                    chunk32[i] = (int32_t)chunk[i];
                    shadow[len + i] = chunk[i];
                }
                for (p = 0; p < 3; p++) {
                    pld_status r = (op & 1) ? pld_index_extend_i32(ix[p], chunk32, c)
                                            : pld_index_extend(ix[p], chunk, c);
                    CHECK(r == PLD_OK);
                }
                len += c;
            } else if (op == 7) { /* reserve: changes no answer */
                size_t extra = t_below(64);
                for (p = 0; p < 3; p++)
                    CHECK(pld_index_reserve(ix[p], extra) == PLD_OK);
            } else { /* truncate */
                size_t nl = len ? t_below(len + 2) : 0;
                for (p = 0; p < 3; p++)
                    CHECK(pld_index_truncate(ix[p], nl) == PLD_OK);
                if (nl < len)
                    len = nl;
            }
            for (p = 0; p < 3; p++) {
                CHECK(pld_index_len(ix[p]) == len);
                CHECK(len == 0 || memcmp(pld_index_tokens(ix[p]), shadow,
                                         len * sizeof *shadow) == 0);
            }
            for (i = 0; i < 2; i++) {
                pld_lookup_opts o;
                size_t k = t_below(7) + (i == 0);
                random_opts(&o, eos, len, vocab);
                for (p = 0; p < 3; p++)
                    if (!check_index(ix[p], shadow, len, min_n, max_n, k, &o)) {
                        fprintf(stderr, "  (iter %d step %zu)\n", iter, step);
                        step = 1000; /* stop this stream after one report */
                        break;
                    }
            }
        }
        for (p = 0; p < 3; p++)
            pld_index_free(ix[p]);
    }
}

/* FIRST on a long stream: equality with the one-shot lookup as it grows. */
static void test_index_long(void)
{
    enum { N = 3000 };
    int64_t *t = malloc(N * sizeof *t);
    pld_index *ix = pld_index_new(2, 5, PLD_POLICY_FIRST);
    pld_lookup_opts so = seed_opts(), to = tf_opts(-1, NULL, 0);
    size_t i, bad = 0;
    if (!t || !ix)
        abort();
    for (i = 0; i < N; i++) /* repetitive text-like stream */
        t[i] = (i % 37 < 20) ? (int64_t)(i % 37) : (int64_t)t_below(30);
    for (i = 0; i < N; i++) {
        int64_t out[8];
        size_t s, c, n;
        if (pld_index_extend(ix, t + i, 1) != PLD_OK)
            bad++;
        n = pld_index_propose(ix, 8, (i & 1) ? &so : &to, out);
        pld_find_candidate_i64(t, i + 1, 2, 5, 8, (i & 1) ? &so : &to, &s, &c);
        if (n != c || (c && memcmp(out, t + s, c * sizeof *out) != 0))
            bad++;
    }
    CHECKF(bad == 0, "%zu mismatches", bad);
    free(t);
    pld_index_free(ix);
}

/* reserve: afterwards `extra` single-token extends allocate nothing (the
 * memory stays put) and the answers are unchanged; bad sizes are refused. */
static void test_index_reserve(void)
{
    enum { N = 2000, EXTRA = 1500 };
    int64_t *t = malloc(N * sizeof *t);
    pld_lookup_opts so = seed_opts();
    int p;
    if (t == NULL)
        abort();
    for (p = 0; p < N; p++)
        t[p] = (int64_t)t_below(p % 3 == 0 ? 4000 : 9);
    CHECK(pld_index_reserve(NULL, 1) == PLD_ERR_ARG);
    for (p = 0; p < 3; p++) {
        pld_index *ix = pld_index_new(1, 3, (pld_policy)p);
        size_t i, bytes, bad = 0, grew = 0;
        if (ix == NULL)
            abort();
        CHECK(pld_index_extend(ix, t, N - EXTRA) == PLD_OK);
        CHECK(pld_index_reserve(ix, 0) == PLD_OK);
        CHECK(pld_index_reserve(ix, PLD_INDEX_MAX_TOKENS) == PLD_ERR_OVERFLOW);
        CHECK(pld_index_reserve(ix, EXTRA) == PLD_OK);
        bytes = pld_index_nbytes(ix);
        for (i = N - EXTRA; i < N; i++) {
            int64_t out[8];
            size_t s, c, n;
            CHECK(pld_index_extend(ix, t + i, 1) == PLD_OK);
            grew += pld_index_nbytes(ix) != bytes;
            if (p != PLD_POLICY_FIRST)
                continue;
            n = pld_index_propose(ix, 8, &so, out);
            pld_find_candidate_i64(t, i + 1, 1, 3, 8, &so, &s, &c);
            if (n != c || (c && memcmp(out, t + s, c * sizeof *out) != 0))
                bad++;
        }
        CHECKF(grew == 0, "policy %d: memory changed in %zu of %d reserved extends", p, grew,
               (int)EXTRA);
        CHECKF(bad == 0, "policy %d: %zu mismatches after reserve", p, bad);
        pld_index_free(ix);
    }
    free(t);
}

/* FIRST files an n-gram (n > min_n) only when its last n-1 tokens repeat:
 * over ids that never repeat, the 2- and 3-gram tables stay empty, so the
 * index takes what a unigram-only index takes plus two empty tables. */
static void test_index_first_files_lazily(void)
{
    enum { N = 5000 };
    pld_index *a = pld_index_new(1, 3, PLD_POLICY_FIRST);
    pld_index *b = pld_index_new(1, 1, PLD_POLICY_FIRST);
    int64_t *t = malloc(N * sizeof *t);
    pld_lookup_opts so = seed_opts();
    size_t i, extra;
    int64_t out[4];
    if (!a || !b || !t)
        abort();
    for (i = 0; i < N; i++)
        t[i] = (int64_t)(i * 7919u % 100003u); /* distinct */
    CHECK(pld_index_extend(a, t, N) == PLD_OK);
    CHECK(pld_index_extend(b, t, N) == PLD_OK);
    extra = pld_index_nbytes(a) - pld_index_nbytes(b);
    /* two tables of 16 slots of 8 bytes, each with a one-word filter */
    CHECKF(extra <= 2 * (16 * 8 + 8), "2- and 3-gram tables take %zu bytes", extra);
    CHECK(pld_index_propose(a, 4, &so, out) == 0);
    /* Now repeat a stretch: its n-grams are found, under FIRST semantics. */
    CHECK(pld_index_extend(a, t + 100, 50) == PLD_OK);
    {
        int64_t *u = malloc((N + 50) * sizeof *u);
        size_t s, c, n;
        if (u == NULL)
            abort();
        memcpy(u, t, N * sizeof *t);
        memcpy(u + N, t + 100, 50 * sizeof *t);
        n = pld_index_propose(a, 4, &so, out);
        pld_find_candidate_i64(u, N + 50, 1, 3, 4, &so, &s, &c);
        CHECK(n == 4 && c == 4 && memcmp(out, u + s, 4 * sizeof *out) == 0);
        free(u);
    }
    free(t);
    pld_index_free(a);
    pld_index_free(b);
}

/* FIRST over a larger vocabulary, where new n-grams are common: the
 * presence filter, the ring of n-grams not yet filed and the array of
 * unigrams by id all come into play (small vocabularies rarely fill the
 * ring). Ids mix the array's range with ids the array does not take
 * (>= 2^20, negative, beyond 32 bits), and many truncations (which file
 * the ring and recompute filter words) are followed by fresh tokens. After
 * every operation the index must propose what the one-shot lookup finds. */
static void test_index_first_large_vocab(uint64_t key)
{
    enum { CAP = 5000, OPS = 700 };
    static const int64_t odd[5] = {((int64_t)1 << 20) + 3, ((int64_t)1 << 20),
                                   -5, ((int64_t)1 << 35) + 1, INT64_MIN};
    int64_t *shadow = malloc(CAP * sizeof *shadow), eos[4];
    size_t sizes, len, op, bad = 0, copy_from = 0, copy_left = 0;
    if (shadow == NULL)
        abort();
    for (sizes = 0; sizes < 3; sizes++) {
        const size_t min_n = sizes == 2 ? 2 : 1, max_n = sizes == 0 ? 3 : 4;
        const size_t vocab = sizes == 1 ? 60 : 400;
        pld_index *ix = pld_index_new_keyed(min_n, max_n, PLD_POLICY_FIRST, key);
        if (ix == NULL)
            abort();
        len = 0;
        for (op = 0; op < OPS; op++) {
            const size_t kind = t_below(10);
            size_t i;
            if (kind < 7 && len < CAP) { /* extend, mostly one token at a time */
                size_t c = kind == 0 ? t_below(300) : 1 + t_below(3);
                if (len + c > CAP)
                    c = CAP - len;
                for (i = 0; i < c; i++) {
                    const size_t r = t_below(100);
                    /* now and then a stretch repeats, as in text */
                    if (copy_left == 0 && r < 4 && len + i > 50) {
                        copy_from = t_below(len + i - 40);
                        copy_left = 3 + t_below(30);
                    }
                    if (copy_left > 0) {
                        shadow[len + i] = shadow[copy_from++];
                        copy_left--;
                    } else if (r < 10) {
                        shadow[len + i] = odd[t_below(5)];
                    } else {
                        shadow[len + i] = (int64_t)t_below(vocab);
                    }
                }
                for (i = 0; i < c; i++) /* one by one: the step path */
                    CHECK(pld_index_extend(ix, shadow + len + i, 1) == PLD_OK);
                len += c;
            } else if (kind == 7) {
                CHECK(pld_index_reserve(ix, t_below(500)) == PLD_OK);
            } else { /* truncate: a little (a rejected draft) or a lot */
                const size_t cut = kind == 8 ? t_below(12) : t_below(len + 1);
                const size_t nl = cut > len ? 0 : len - cut;
                CHECK(pld_index_truncate(ix, nl) == PLD_OK);
                len = nl;
            }
            CHECK(pld_index_len(ix) == len);
            for (i = 0; i < 2; i++) {
                pld_lookup_opts o;
                random_opts(&o, eos, len, vocab);
                if (!check_index(ix, shadow, len, min_n, max_n, 1 + t_below(12), &o))
                    bad++;
            }
            if (bad > 3)
                break;
        }
        pld_index_free(ix);
    }
    CHECKF(bad == 0, "key %llx: %zu proposals differ from the one-shot lookup",
           (unsigned long long)key, bad);
    free(shadow);
}

/* ------------------------------------------------------ acceptance tests */

/* The id in [0, 2^32) whose unigram tag is `tag` (inverts the index's
 * 32-bit unigram mix; the caller checks the result). */
static uint32_t unmix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x43021123u; /* inverse of 0x846ca68b mod 2^32 */
    x ^= (x >> 15) ^ (x >> 30);
    x *= 0x1d69e2a5u; /* inverse of 0x7feb352d mod 2^32 */
    x ^= x >> 16;
    return x;
}

/* An id outside [0, 2^32) and an in-range id with the same tag: the index
 * must compare their tokens instead of trusting the tag. */
static void test_index_tag_collision(void)
{
    const int64_t wides[3] = {((int64_t)1 << 40) + 12345, -7, INT64_MAX};
    size_t w, order, pol, len, k;
    for (w = 0; w < 3; w++) {
        const int64_t wide = wides[w];
        const uint32_t tag = pld_index_ngram_tag(&wide, 1, 0);
        const int64_t twin = (int64_t)unmix32(tag);
        CHECKF(pld_index_ngram_tag(&twin, 1, 0) == tag, "no tag twin for %lld",
               (long long)wide);
        for (order = 0; order < 2; order++) {
            const int64_t a = order ? wide : twin, b = order ? twin : wide;
            const int64_t seq[10] = {a, 1, b, 2, a, 3, b, 4, a, b};
            for (pol = 0; pol < 3; pol++) {
                pld_index *ix = pld_index_new(1, 2, (pld_policy)pol);
                pld_lookup_opts o = seed_opts();
                for (len = 1; len <= 10; len++) {
                    CHECK(pld_index_extend(ix, seq + len - 1, 1) == PLD_OK);
                    for (k = 1; k <= 3; k++)
                        check_index(ix, seq, len, 1, 2, k, &o);
                }
                pld_index_free(ix);
            }
        }
    }
}

/* Indexes under different hash keys over the same random operations: the
 * key changes where entries sit, never an answer, so every index agrees
 * with the references (and so with each other). Ids mix a small
 * vocabulary with ids outside the array of unigrams by id, outside
 * [0, 2^32) and at the int64 extremes. */
static void test_index_keys_random(void)
{
    enum { NKEYS = 5, CAP = 150 };
    static const int64_t odd[6] = {((int64_t)1 << 20) + 7, ((int64_t)1 << 32),
                                   ((int64_t)1 << 32) - 1, -1, INT64_MIN, INT64_MAX};
    uint64_t keys[NKEYS];
    int iter;
    keys[0] = 0;
    keys[1] = 1;
    keys[2] = t_next();
    keys[3] = t_next();
    keys[4] = ~(uint64_t)0;
    for (iter = 0; iter < 150; iter++) {
        const size_t min_n = 1 + t_below(3), max_n = min_n + t_below(4);
        const size_t vocab = 1 + t_below(iter % 3 == 0 ? 3 : 40);
        size_t len = 0, step, p, q;
        int64_t shadow[CAP], eos[4];
        pld_index *ix[3][NKEYS];
        for (p = 0; p < 3; p++)
            for (q = 0; q < NKEYS; q++) {
                ix[p][q] = pld_index_new_keyed(min_n, max_n, (pld_policy)p, keys[q]);
                if (ix[p][q] == NULL)
                    abort();
                CHECK(pld_index_key(ix[p][q]) == keys[q]);
            }
        for (step = 0; step < 30; step++) {
            const size_t op = t_below(10);
            size_t i;
            if (op < 7 && len < CAP) {
                size_t c = 1 + t_below(op == 0 ? 20 : 3);
                if (len + c > CAP)
                    c = CAP - len;
                for (i = 0; i < c; i++)
                    shadow[len + i] = t_below(8) == 0 ? odd[t_below(6)]
                                                      : (int64_t)t_below(vocab);
                for (p = 0; p < 3; p++)
                    for (q = 0; q < NKEYS; q++)
                        CHECK(pld_index_extend(ix[p][q], shadow + len, c) == PLD_OK);
                len += c;
            } else if (op == 7) {
                const size_t extra = t_below(100);
                for (p = 0; p < 3; p++)
                    for (q = 0; q < NKEYS; q++)
                        CHECK(pld_index_reserve(ix[p][q], extra) == PLD_OK);
            } else {
                const size_t nl = len ? t_below(len + 2) : 0;
                for (p = 0; p < 3; p++)
                    for (q = 0; q < NKEYS; q++)
                        CHECK(pld_index_truncate(ix[p][q], nl) == PLD_OK);
                if (nl < len)
                    len = nl;
            }
            {
                pld_lookup_opts o;
                const size_t k = 1 + t_below(8);
                int ok = 1;
                random_opts(&o, eos, len, vocab);
                for (p = 0; p < 3 && ok; p++)
                    for (q = 0; q < NKEYS && ok; q++)
                        ok = check_index(ix[p][q], shadow, len, min_n, max_n, k, &o);
                if (!ok) {
                    fprintf(stderr, "  (iter %d step %zu key %llx)\n", iter, step,
                            (unsigned long long)keys[q - 1]);
                    break;
                }
            }
        }
        for (p = 0; p < 3; p++)
            for (q = 0; q < NKEYS; q++)
                pld_index_free(ix[p][q]);
    }
}

static int cmp_u32(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The keyed tags themselves:
 *   - known answers (the portable 128-bit multiply must give the same tags
 *     as the compiler's; key 0 keeps the unkeyed unigram mix, which
 *     unmix32 inverts);
 *   - the unigram tag stays a bijection under a nonzero key (tag_is_key);
 *   - ids crafted to share the low 16 bits of their key-0 tags spread over
 *     the homes under random keys;
 *   - n-grams whose tokens differ in the top bits only, which a plain
 *     64-bit multiply step would collide under every key, do not. */
static void test_index_key_tags(void)
{
    enum { NS = 1 << 16, NC = 4096 };
    const int64_t g3[3] = {17, -2, (int64_t)1 << 40};
    uint32_t *tags = malloc(NS * sizeof *tags);
    uint16_t *hits = malloc(65536 * sizeof *hits);
    int64_t *crafted = malloc(NC * sizeof *crafted);
    size_t i, r, dup, distinct, worst;
    uint32_t hi;
    if (tags == NULL || hits == NULL || crafted == NULL)
        abort();
    {   /* known answers */
        const int64_t u = 123456789, w = -7;
        CHECK(pld_index_ngram_tag(&u, 1, 0) == 0xa8f1db88u);
        CHECK(pld_index_ngram_tag(&u, 1, 0x0123456789abcdefull) == 0x5239fa41u);
        CHECK(pld_index_ngram_tag(&w, 1, 0) == 0x87fc224au);
        CHECK(pld_index_ngram_tag(g3, 3, 0) == 0xcd9975d5u);
        CHECK(pld_index_ngram_tag(g3, 3, 0x0123456789abcdefull) == 0x44bf3aaau);
        CHECK(unmix32(pld_index_ngram_tag(&u, 1, 0)) == 123456789u);
        CHECK(pld_index_ngram_tag(g3, 3, 1) != pld_index_ngram_tag(g3, 3, 0));
    }
    for (r = 0; r < 4; r++) { /* bijection on a sample: distinct ids, distinct tags */
        const uint64_t key = r == 0 ? 1 : t_next();
        const uint32_t base = (uint32_t)t_next();
        for (i = 0; i < NS; i++) {
            /* a run of consecutive ids, then ids differing in high bits */
            const uint32_t id = i < NS / 2 ? base + (uint32_t)i
                                           : base ^ ((uint32_t)i << 15);
            const int64_t t = (int64_t)id;
            tags[i] = pld_index_ngram_tag(&t, 1, key);
        }
        qsort(tags, NS, sizeof *tags, cmp_u32);
        for (i = 1, dup = 0; i < NS; i++)
            dup += tags[i] == tags[i - 1];
        CHECKF(dup == 0, "key %llx: %zu repeated unigram tags", (unsigned long long)key, dup);
    }
    /* ids >= 2^20 whose key-0 tags share the low 16 bits */
    for (hi = 0, i = 0; i < NC; hi++) {
        const uint32_t id = unmix32((hi << 16) | 0x5a5au);
        if (id >= (1u << 20))
            crafted[i++] = (int64_t)id;
    }
    for (r = 0; r < 5; r++) {
        const uint64_t key = r == 0 ? 0 : t_next();
        memset(hits, 0, 65536 * sizeof *hits);
        for (i = 0, distinct = 0, worst = 0; i < NC; i++) {
            const uint16_t home = (uint16_t)pld_index_ngram_tag(crafted + i, 1, key);
            distinct += hits[home]++ == 0;
            if (hits[home] > worst)
                worst = hits[home];
        }
        if (r == 0) {
            CHECK(distinct == 1); /* the attack works under the fixed key */
        } else {
            /* as random: about 65536 * (1 - exp(-1/16)) = 3973 homes */
            CHECKF(distinct > 3800 && worst <= 8,
                   "key %llx: crafted ids use %zu homes, up to %zu each",
                   (unsigned long long)key, distinct, worst);
        }
    }
    /* 3-grams (a, b, c) ^ masks from {0, T} per token where a plain
     * multiply-xorshift step would carry a difference of 2^63 | 2^31
     * unchanged: with T = 2^63 and D = 2^63 | 2^31, the family
     * c^x, b^(x ? D : 0)^y, a^(y ? D : 0) over x, y in {0, T}. */
    for (r = 0; r < 16; r++) {
        const uint64_t key = t_next(), T = (uint64_t)1 << 63, D = T | ((uint64_t)1 << 31);
        uint32_t fam[4];
        size_t x, y, collide = 0;
        for (x = 0; x < 2; x++)
            for (y = 0; y < 2; y++) {
                int64_t g[3];
                g[2] = (int64_t)((uint64_t)g3[2] ^ (x ? T : 0));
                g[1] = (int64_t)((uint64_t)g3[1] ^ (x ? D : 0) ^ (y ? T : 0));
                g[0] = (int64_t)((uint64_t)g3[0] ^ (y ? D : 0));
                fam[2 * x + y] = pld_index_ngram_tag(g, 3, key);
            }
        for (x = 0; x < 4; x++)
            for (y = x + 1; y < 4; y++)
                collide += fam[x] == fam[y];
        CHECKF(collide == 0, "key %llx: %zu colliding 3-gram pairs",
               (unsigned long long)key, collide);
    }
    free(tags);
    free(hits);
    free(crafted);
}

/* ------------------------------------------------------ tree acceptance */

static void test_tree_depths(void)
{
    const int64_t chain[] = {-1, 0, 1, 2};
    const int64_t bushy[] = {-1, -1, 0, 1, 2, 0};
    const int64_t bad1[] = {0}, bad2[] = {-1, 1}, bad3[] = {-1, -2}, bad4[] = {-1, 0, 3};
    size_t depths[6], d = 99;
    CHECK(pld_tree_depths(chain, 4, depths, &d) == PLD_OK && d == 4 && depths[3] == 4);
    CHECK(pld_tree_depths(bushy, 6, depths, &d) == PLD_OK && d == 3);
    CHECK(depths[0] == 1 && depths[1] == 1 && depths[2] == 2 && depths[3] == 2 &&
          depths[4] == 3 && depths[5] == 2);
    CHECK(pld_tree_depths(NULL, 0, NULL, &d) == PLD_OK && d == 0);
    CHECK(pld_tree_depths(bad1, 1, depths, &d) == PLD_ERR_ARG);
    CHECK(pld_tree_depths(bad2, 2, depths, &d) == PLD_ERR_ARG);
    CHECK(pld_tree_depths(bad3, 2, depths, &d) == PLD_ERR_ARG);
    CHECK(pld_tree_depths(bad4, 3, depths, &d) == PLD_ERR_ARG);
    CHECK(pld_tree_depths(chain, 4, NULL, &d) == PLD_ERR_ARG);
    CHECK(pld_tree_depths(chain, 4, depths, NULL) == PLD_ERR_ARG);
}

static void test_tree_greedy_hand(void)
{
    /*      root
     *     /  |   \
     *   0:5 1:6  4:5 (a duplicate of 0: never reached)
     *    |   |
     *   2:7 3:8
     */
    const int64_t nodes[] = {5, 6, 7, 8, 5};
    const int64_t parents[] = {-1, -1, 0, 1, -1};
    size_t path[5], m = 99;
    int64_t out[6];
    {
        const int64_t c[] = {5, 7, 0, 9, 2, 3}; /* 5 -> node 0, 7 -> node 2, then 9 */
        CHECK(pld_accept_tree_greedy(nodes, parents, 5, c, path, out, &m) == PLD_OK);
        CHECK(m == 2 && path[0] == 0 && path[1] == 2 && out[0] == 5 && out[1] == 7 &&
              out[2] == 9);
    }
    {
        const int64_t c[] = {6, 0, 0, 0, 8, 0}; /* 6 -> node 1, position 2 says 0: stop */
        CHECK(pld_accept_tree_greedy(nodes, parents, 5, c, path, out, &m) == PLD_OK);
        CHECK(m == 1 && path[0] == 1 && out[0] == 6 && out[1] == 0);
    }
    {
        const int64_t c[] = {4, 7, 7, 7, 7, 7}; /* no child of the root has 4 */
        CHECK(pld_accept_tree_greedy(nodes, parents, 5, c, path, out, &m) == PLD_OK);
        CHECK(m == 0 && out[0] == 4);
    }
    {   /* the root alone */
        const int64_t c[] = {3};
        CHECK(pld_accept_tree_greedy(NULL, NULL, 0, c, NULL, out, &m) == PLD_OK);
        CHECK(m == 0 && out[0] == 3);
    }
    {   /* a chain, all accepted; negative and extreme ids are plain ids */
        const int64_t cn[] = {INT64_MIN, -1, INT64_MAX};
        const int64_t cp[] = {-1, 0, 1};
        const int64_t c[] = {INT64_MIN, -1, INT64_MAX, 42};
        CHECK(pld_accept_tree_greedy(cn, cp, 3, c, path, out, &m) == PLD_OK);
        CHECK(m == 3 && path[2] == 2 && out[3] == 42 && out[0] == INT64_MIN);
    }
    {   /* errors */
        const int64_t c[] = {5, 7, 9, 1, 2, 3};
        const int64_t bad[] = {-1, -1, 2, 1, -1};
        CHECK(pld_accept_tree_greedy(nodes, bad, 5, c, path, out, &m) == PLD_ERR_ARG);
        CHECK(pld_accept_tree_greedy(NULL, parents, 5, c, path, out, &m) == PLD_ERR_ARG);
        CHECK(pld_accept_tree_greedy(nodes, NULL, 5, c, path, out, &m) == PLD_ERR_ARG);
        CHECK(pld_accept_tree_greedy(nodes, parents, 5, NULL, path, out, &m) == PLD_ERR_ARG);
        CHECK(pld_accept_tree_greedy(nodes, parents, 5, c, NULL, out, &m) == PLD_ERR_ARG);
        CHECK(pld_accept_tree_greedy(nodes, parents, 5, c, path, NULL, &m) == PLD_ERR_ARG);
        CHECK(pld_accept_tree_greedy(nodes, parents, 5, c, path, out, NULL) == PLD_ERR_ARG);
    }
}

static uint16_t f16_bits(double v) /* exact small values only */
{
    if (v == 0)
        return 0;
    if (v == 1)
        return 0x3C00;
    if (v == 2)
        return 0x4000;
    if (v == 3)
        return 0x4200;
    if (v == 0.5)
        return 0x3800;
    abort();
}

static void test_tree_sample_hand(void)
{
    /* root -> 0:1 -> 2:0 ; root -> 1:2 ; rows: 4 positions x 3 tokens */
    const int64_t nodes[] = {1, 2, 0};
    const int64_t parents[] = {-1, -1, 0};
    const float p[] = {1, 2, 1, /* root: 1 w.p. 1/2 (u in [.25, .75)) */
                       3, 0, 1, /* node 0: 0 w.p. 3/4 */
                       0, 0, 5, /* node 1: always 2 */
                       0, 1, 1};
    size_t path[3], m = 99;
    int64_t out[4];
    {
        const double u[] = {0.5, 0.7, 0.9};
        CHECK(pld_accept_tree_sample(nodes, parents, 3, p, PLD_F32, 4, 3, u, 3, path, out, &m) ==
              PLD_OK);
        /* depth 0: u .5 -> 1 (node 0); depth 1: u .7 -> 0 (node 2); depth 2: u .9 -> 2 */
        CHECK(m == 2 && path[0] == 0 && path[1] == 2 && out[0] == 1 && out[1] == 0 &&
              out[2] == 2);
    }
    {
        const double u[] = {0.8, 0.7, 0.0}; /* 2 at the root -> node 1; then row 2 -> 2 */
        CHECK(pld_accept_tree_sample(nodes, parents, 3, p, PLD_F32, 4, 3, u, 3, path, out, &m) ==
              PLD_OK);
        CHECK(m == 1 && path[0] == 1 && out[0] == 2 && out[1] == 2);
    }
    {
        const double u[] = {0.1, 0.0, 0.0}; /* 0 at the root: no such child */
        CHECK(pld_accept_tree_sample(nodes, parents, 3, p, PLD_F32, 4, 3, u, 3, path, out, &m) ==
              PLD_OK);
        CHECK(m == 0 && out[0] == 0);
    }
    {
        const double u[] = {0.5, 0.76, 0.0}; /* node 0's row at .76: 2 (not a child) */
        CHECK(pld_accept_tree_sample(nodes, parents, 3, p, PLD_F32, 4, 3, u, 3, path, out, &m) ==
              PLD_OK);
        CHECK(m == 1 && path[0] == 0 && out[1] == 2);
    }
    {   /* f16 and bf16 rows give the same draws as their float values */
        const float q[] = {0, 2, 0, /**/ 0.5, 0, 0};
        uint16_t h[6], b[6];
        const int64_t cn[] = {1}, cp[] = {-1};
        const double u[] = {0.9, 0.9};
        size_t i;
        for (i = 0; i < 6; i++) {
            uint32_t bits;
            memcpy(&bits, &q[i], 4);
            h[i] = f16_bits(q[i]);
            b[i] = (uint16_t)(bits >> 16);
        }
        CHECK(pld_accept_tree_sample(cn, cp, 1, h, PLD_F16, 2, 3, u, 2, path, out, &m) == PLD_OK);
        CHECK(m == 1 && out[0] == 1 && out[1] == 0);
        CHECK(pld_accept_tree_sample(cn, cp, 1, b, PLD_BF16, 2, 3, u, 2, path, out, &m) ==
              PLD_OK);
        CHECK(m == 1 && out[0] == 1 && out[1] == 0);
    }
    {   /* the root alone: one draw from row 0 */
        const float q[] = {0, 0, 3};
        const double u[] = {0.7};
        CHECK(pld_accept_tree_sample(NULL, NULL, 0, q, PLD_F32, 1, 3, u, 1, NULL, out, &m) ==
              PLD_OK);
        CHECK(m == 0 && out[0] == 2);
    }
    {   /* values: only visited rows are read */
        const float q[] = {1, 0, /**/ NAN, 1, /**/ 1, 1};
        const float neg[] = {1, -1, /**/ 1, 1}, inf[] = {INFINITY, 0, 1, 1},
                    zero[] = {0, 0, 1, 1};
        const int64_t cn[] = {0, 1}, cp[] = {-1, -1}, one[] = {-1};
        const double u[] = {0.5, 0.5};
        CHECK(pld_accept_tree_sample(cn, cp, 2, q, PLD_F32, 3, 2, u, 2, path, out, &m) ==
              PLD_ERR_VALUE); /* 0 at the root -> node 0, whose row has a NaN */
        CHECK(pld_accept_tree_sample(cn + 1, one, 1, q, PLD_F32, 3, 2, u, 2, path, out, &m) ==
              PLD_OK); /* 0 at the root: no child; the NaN row is never read */
        CHECK(m == 0 && out[0] == 0);
        CHECK(pld_accept_tree_sample(cn, one, 1, neg, PLD_F32, 2, 2, u, 2, path, out, &m) ==
              PLD_ERR_VALUE);
        CHECK(pld_accept_tree_sample(cn, one, 1, inf, PLD_F32, 2, 2, u, 2, path, out, &m) ==
              PLD_ERR_VALUE);
        CHECK(pld_accept_tree_sample(cn, one, 1, zero, PLD_F32, 2, 2, u, 2, path, out, &m) ==
              PLD_ERR_VALUE);
    }
    {   /* arguments */
        const double u[] = {0.5, 0.5, 0.5};
        const int64_t bad[] = {-1, 1, 0};
        CHECK(pld_accept_tree_sample(nodes, parents, 3, p, PLD_F32, 4, 3, u, 2, path, out, &m) ==
              PLD_ERR_ARG); /* depth 2 needs 3 uniforms */
        CHECK(pld_accept_tree_sample(nodes, parents, 3, p, PLD_F32, 3, 3, u, 3, path, out, &m) ==
              PLD_ERR_ARG); /* rows < n + 1 */
        CHECK(pld_accept_tree_sample(nodes, parents, 3, p, PLD_F32, 4, 0, u, 3, path, out, &m) ==
              PLD_ERR_ARG);
        CHECK(pld_accept_tree_sample(nodes, parents, 3, p, (pld_float_type)3, 4, 3, u, 3, path,
                                     out, &m) == PLD_ERR_ARG);
        CHECK(pld_accept_tree_sample(nodes, bad, 3, p, PLD_F32, 4, 3, u, 3, path, out, &m) ==
              PLD_ERR_ARG);
        CHECK(pld_accept_tree_sample(nodes, parents, 3, NULL, PLD_F32, 4, 3, u, 3, path, out,
                                     &m) == PLD_ERR_ARG);
        CHECK(pld_accept_tree_sample(nodes, parents, 3, p, PLD_F32, 4, 3, NULL, 3, path, out,
                                     &m) == PLD_ERR_ARG);
        CHECK(pld_accept_tree_sample(nodes, parents, 3, p, PLD_F32, 4, 3, u, 3, path, out,
                                     &m) == PLD_OK);
    }
}

/* A random tree of n nodes over tokens [0, vocab): parents in [-1, i),
 * often a chain, siblings with equal tokens included. */
static void random_tree(size_t n, size_t vocab, int64_t *nodes, int64_t *parents)
{
    const int chain = t_below(3) == 0;
    size_t i;
    for (i = 0; i < n; i++) {
        parents[i] = chain ? (int64_t)i - 1 : (int64_t)t_below(i + 1) - 1;
        nodes[i] = (int64_t)t_below(vocab);
    }
}

static double t_uniform(void) { return (double)(t_next() >> 11) * 0x1.0p-53; }

/* Random trees against the naive walks, in all three float types; the
 * rows the walk must not visit hold NaN, which it would report. */
static void test_tree_random(void)
{
    int iter;
    for (iter = 0; iter < 20000; iter++) {
        enum { MAXN = 12 };
        const size_t n = t_below(MAXN + 1), vocab = 1 + t_below(4);
        const pld_float_type ft = (pld_float_type)(iter % 3);
        int64_t nodes[MAXN], parents[MAXN], choices[MAXN + 1], out[MAXN + 1], want[MAXN + 1];
        size_t path[MAXN], wpath[MAXN], m = 99, wm, i, j, visited[MAXN + 1];
        double u[MAXN + 1];
        unsigned char probs[(MAXN + 1) * 4 * 4];
        long depth, rm;
        random_tree(n, vocab, nodes, parents);
        depth = ref_tree_depth(parents, n);
        for (i = 0; i <= n; i++)
            choices[i] = (int64_t)t_below(vocab);
        wm = ref_tree_greedy(nodes, parents, n, choices, wpath, want);
        CHECK(pld_accept_tree_greedy(nodes, parents, n, choices, path, out, &m) == PLD_OK);
        CHECKF(m == wm && !memcmp(path, wpath, m * sizeof *path) &&
               !memcmp(out, want, (m + 1) * sizeof *out), "greedy n=%zu m=%zu want %zu", n, m, wm);
        /* sampling: small integer weights, zeros common */
        for (i = 0; i < (n + 1) * vocab; i++) {
            const unsigned w = (unsigned)t_below(4);
            if (ft == PLD_F32) {
                const float f = (float)w;
                memcpy(probs + 4 * i, &f, 4);
            } else {
                const uint16_t h = (uint16_t)(w == 0 ? 0 : (ft == PLD_F16 ? 0x3C00 : 0x3F80) +
                                                           (w - 1) * (ft == PLD_F16 ? 0x400 : 0x80));
                memcpy(probs + 2 * i, &h, 2);
            }
        }
        for (i = 0; i <= n; i++) { /* no row without mass */
            for (j = 0; j < vocab && !(ref_elem(probs, ft, i * vocab + j) > 0); j++)
                ;
            if (j == vocab) {
                const float f = 1;
                const uint16_t h = ft == PLD_F16 ? 0x3C00 : 0x3F80;
                if (ft == PLD_F32)
                    memcpy(probs + 4 * (i * vocab), &f, 4);
                else
                    memcpy(probs + 2 * (i * vocab), &h, 2);
            }
        }
        for (i = 0; i <= (size_t)depth; i++)
            u[i] = t_uniform();
        rm = ref_tree_sample(nodes, parents, n, probs, ft, vocab, u, wpath, want);
        CHECK(rm >= 0);
        /* poison every row the walk does not visit */
        visited[0] = 0;
        for (i = 0; i < (size_t)rm; i++)
            visited[i + 1] = wpath[i] + 1;
        for (i = 0; i <= n; i++) {
            int seen = 0;
            for (j = 0; j <= (size_t)rm; j++)
                seen |= visited[j] == i;
            for (j = 0; j < vocab && !seen; j++) {
                const float f = NAN;
                const uint16_t h = ft == PLD_F16 ? 0x7E00 : 0x7FC0;
                if (ft == PLD_F32)
                    memcpy(probs + 4 * (i * vocab + j), &f, 4);
                else
                    memcpy(probs + 2 * (i * vocab + j), &h, 2);
            }
        }
        m = 99;
        CHECK(pld_accept_tree_sample(nodes, parents, n, probs, ft, n + 1, vocab, u,
                                     (size_t)depth + 1, path, out, &m) == PLD_OK);
        CHECKF(m == (size_t)rm && !memcmp(path, wpath, m * sizeof *path) &&
               !memcmp(out, want, (m + 1) * sizeof *out), "sample ft=%d n=%zu m=%zu want %ld",
               (int)ft, n, m, rm);
        if (depth >= 0)
            CHECK(pld_accept_tree_sample(nodes, parents, n, probs, ft, n + 1, vocab, u,
                                         (size_t)depth, path, out, &m) == PLD_ERR_ARG);
    }
}

/* The law of the first two tokens is the model's, through a chain and
 * through a tree: P(t1 = a) = p0(a), and P(t1 = a, t2 = b) = p0(a) q_a(b)
 * where q_a is the row of the (first) child of the root with token a. */
static void test_tree_sample_distribution(void)
{
    /* tree: root -> 0:2, 1:1, 2:2 (a duplicate of 0, never reached); 0 -> 3:0.
     * chain: root -> 0:2 -> 1:0 (rows 0, 1 and 4 of p). */
    static const int64_t tree_n[] = {2, 1, 2, 0}, tree_p[] = {-1, -1, -1, 0};
    static const int64_t chain_n[] = {2, 0}, chain_p[] = {-1, 0};
    static const float p[] = {0.1f, 0.3f, 0.6f, /* root */
                              0.5f, 0.25f, 0.25f, /* node 0 (after 2) */
                              0.2f, 0.2f, 0.6f, /* node 1 (after 1) */
                              1.0f, 0.0f, 0.0f, /* node 2: never visited */
                              0.3f, 0.3f, 0.4f}; /* node 3 */
    float chain_rows[9];
    int tree;
    memcpy(chain_rows, p, 6 * sizeof(float));
    memcpy(chain_rows + 6, p + 12, 3 * sizeof(float));
    for (tree = 0; tree < 2; tree++) {
        enum { T = 200000 };
        const int64_t *nodes = tree ? tree_n : chain_n, *parents = tree ? tree_p : chain_p;
        const size_t n = tree ? 4 : 2;
        const float *rows = tree ? p : chain_rows;
        long first[3] = {0}, joint[3][3] = {{0}};
        size_t t, a, b;
        double worst = 0;
        for (t = 0; t < T; t++) {
            double u[3];
            int64_t out[5];
            size_t path[4], m;
            u[0] = t_uniform();
            u[1] = t_uniform();
            u[2] = t_uniform();
            if (pld_accept_tree_sample(nodes, parents, n, rows, PLD_F32, n + 1, 3, u, 3, path, out,
                                       &m) != PLD_OK) {
                worst = 1;
                break;
            }
            first[out[0]]++;
            if (m >= 1)
                joint[out[0]][out[1]]++;
        }
        for (a = 0; a < 3; a++) {
            const float *q = a == 2 ? p + 3 : (a == 1 && tree) ? p + 6 : NULL;
            worst = fmax(worst, fabs((double)first[a] / T - p[a]));
            for (b = 0; b < 3; b++)
                worst = fmax(worst, fabs((double)joint[a][b] / T - (q ? (double)p[a] * q[b] : 0)));
        }
        CHECKF(worst < 0.005, "%s: max deviation %.4f", tree ? "tree" : "chain", worst);
    }
}

int main(void)
{
    test_lookup_hand();
    test_lookup_errors();
    test_lookup_random();
    test_lookup_huge_k();
    test_index_new_errors();
    test_index_hand();
    test_index_random();
    test_index_long();
    test_index_reserve();
    test_index_first_files_lazily();
    test_index_first_large_vocab(0);
    test_index_first_large_vocab(t_next());
    test_index_tag_collision();
    test_index_keys_random();
    test_index_key_tags();
    test_tree_depths();
    test_tree_greedy_hand();
    test_tree_sample_hand();
    test_tree_random();
    test_tree_sample_distribution();
    printf("test_core: %ld passed, %ld failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
