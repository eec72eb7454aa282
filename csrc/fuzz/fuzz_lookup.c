/*
 * fuzz_lookup.c -- libFuzzer target: pld_find_candidate_i64 / _i32 against
 * a naive reference that follows pld.h literally (ref_find with latest = 0,
 * tests/naive_reference.h). Aborts on any mismatch.
 *
 * Input layout:
 *   [0] min_n - 1 (low 3 bits; 0x80: min_n up to 70)
 *   [1] max_n - min_n (low 3 bits; 0x80: + 60, to cross PLD_MAX_NGRAM: must be refused)
 *   [2] k - 1 (mod 16)
 *   [3] bit 0: semantics; bits 1-2: max_length mode; bits 3-4: n_eos
 *   [4] max_length offset; [5..6] eos token indices
 *   [7] vocab - 1 (low 3 bits); 0x80: large/negative token values
 *   [8..] one token per byte, byte % vocab mapped through a value table
 */
#include "pld.h"
#include "tests/naive_reference.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LEN 4096

static void dump(const char *what, const int64_t *t, size_t len, size_t min_n,
                 size_t max_n, size_t k, const pld_lookup_opts *o, size_t gs,
                 size_t gc, size_t rs, size_t rc)
{
    size_t i;
    fprintf(stderr, "%s mismatch: min_n=%zu max_n=%zu k=%zu semantics=%d "
            "max_length=%lld n_eos=%zu got (%zu,%zu) want (%zu,%zu)\nt[%zu]=",
            what, min_n, max_n, k, (int)o->semantics, (long long)o->max_length,
            o->n_eos, gs, gc, rs, rc, len);
    for (i = 0; i < len && i < 200; i++)
        fprintf(stderr, "%lld,", (long long)t[i]);
    fprintf(stderr, "\n");
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int64_t t64[MAX_LEN], tr[MAX_LEN];
    static int32_t t32[MAX_LEN];
    int64_t eos[2];
    size_t min_n, max_n, k, vocab, len, i, rs, rc, s, c;
    pld_lookup_opts o;
    pld_status st;
    int big;
    if (size < 8)
        return 0;
    min_n = 1 + (data[0] & 7);
    if (data[0] & 0x80)
        min_n += 60 + (data[0] >> 3 & 7);
    max_n = min_n + (data[1] & 7);
    if (data[1] & 0x80)
        max_n += 60;
    k = 1 + data[2] % 16;
    vocab = 1 + (data[7] & 7);
    big = (data[7] & 0x80) != 0;
    len = size - 8;
    if (len > MAX_LEN)
        len = MAX_LEN;
    for (i = 0; i < len; i++) {
        int64_t v = data[8 + i] % vocab;
        int32_t v32 = (int32_t)v;
        if (big) {
            v32 = (int32_t)((uint32_t)v * 0x9E3779B1u); /* negatives too */
            v = (int64_t)((uint64_t)v * 0x9E3779B97F4A7C15ull);
        }
        t64[i] = v;
        t32[i] = v32;
        tr[i] = v32;
    }
    memset(&o, 0, sizeof o);
    o.semantics = (data[3] & 1) ? PLD_TRANSFORMERS : PLD_SEED;
    switch (data[3] >> 1 & 3) {
    case 0: o.max_length = -1; break;
    case 1: o.max_length = (int64_t)len + 1; break;
    case 2: o.max_length = (int64_t)len + 1 - (int64_t)(data[4] % 16); break;
    default: o.max_length = (int64_t)data[4] * 17 - 1000; break; /* < 0 too */
    }
    o.n_eos = data[3] >> 3 & 3;
    if (o.n_eos > 2)
        o.n_eos = 2;
    eos[0] = data[5] % vocab;
    eos[1] = data[6] % vocab;
    if (big) {
        eos[0] = (int64_t)((uint64_t)eos[0] * 0x9E3779B97F4A7C15ull);
        eos[1] = (int64_t)((uint64_t)eos[1] * 0x9E3779B97F4A7C15ull);
    }
    o.eos = eos;

    /* sizes past PLD_MAX_NGRAM are refused, never half-served */
    if (max_n > PLD_MAX_NGRAM) {
        if (pld_find_candidate_i64(t64, len, min_n, max_n, k, &o, &s, &c) != PLD_ERR_ARG ||
            pld_find_candidate_i32(t32, len, min_n, max_n, k, &o, &s, &c) != PLD_ERR_ARG)
            abort();
        return 0;
    }

    /* int64 */
    rc = ref_find(t64, len, min_n, max_n, k, &o, 0, &rs);
    st = pld_find_candidate_i64(t64, len, min_n, max_n, k, &o, &s, &c);
    if (st != PLD_OK || c != rc || (rc && s != rs))
        dump("i64", t64, len, min_n, max_n, k, &o, s, c, rs, rc);

    /* int32 (the eos values are compared as int64) */
    if (big) {
        eos[0] = (int32_t)((uint32_t)(data[5] % vocab) * 0x9E3779B1u);
        eos[1] = (int32_t)((uint32_t)(data[6] % vocab) * 0x9E3779B1u);
    }
    rc = ref_find(tr, len, min_n, max_n, k, &o, 0, &rs);
    st = pld_find_candidate_i32(t32, len, min_n, max_n, k, &o, &s, &c);
    if (st != PLD_OK || c != rc || (rc && s != rs))
        dump("i32", tr, len, min_n, max_n, k, &o, s, c, rs, rc);

    /* argument errors never touch the outputs' meaning */
    if (pld_find_candidate_i64(t64, len, 0, max_n, k, &o, &s, &c) != PLD_ERR_ARG ||
        pld_find_candidate_i64(t64, len, max_n + 1, max_n, k, &o, &s, &c) != PLD_ERR_ARG ||
        pld_find_candidate_i32(t32, len, min_n, max_n, 0, &o, &s, &c) != PLD_ERR_ARG)
        abort();
    return 0;
}
