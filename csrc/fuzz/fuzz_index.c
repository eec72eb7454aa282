/*
 * fuzz_index.c -- libFuzzer target: a sequence of extend / truncate /
 * propose operations applied to three indexes (FIRST, RECENT, FREQUENT)
 * over the same sequence, with a shadow copy kept here.
 *
 * After every operation: all three hold the shadow sequence; FIRST
 * proposes exactly what pld_find_candidate_i64 finds; RECENT and FREQUENT
 * agree with the brute-force references of tests/naive_reference.h (while
 * the sequence is short enough for brute force). Aborts on any mismatch.
 *
 * Input layout:
 *   [0] min_n - 1 (mod 4)      [1] max_n - min_n (mod 5; 0x80: max_n 64)
 *   [2] vocab - 1 (mod 6); with bit 0x80: vocab 64 + 16 * (bits 0-5),
 *       each token then read from two bytes (new n-grams are common: the
 *       FIRST index's filter and its ring of n-grams not yet filed fill)
 *                              [3] bits 0-1: eos count, bit 2: large ids
 *   [4..5] eos token indices
 *   then ops, one byte each plus arguments:
 *     op % 8 in 0..3  extend by (next byte % 24) tokens from the input
 *                     (op 1 and 3 via pld_index_extend_i32)
 *     op % 8 == 4     truncate to (next byte) * len / 255
 *     op % 8 == 5     truncate by (next byte % 4)
 *                     (ops 4, 5 with bit 0x40 set: reserve next byte instead)
 *     op % 8 in 6..7  propose with k = next byte % 20, opts from op bits
 */
#include "pld.h"
#include "tests/naive_reference.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAP 2048
#define BRUTE_MAX 300

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int64_t seq[CAP];
    pld_index *ix[3];
    size_t min_n, max_n, vocab, len = 0, p;
    int64_t eos[2];
    int big;
    pld_lookup_opts o;
    if (size < 6)
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
    g_data = data;
    g_size = size;
    g_pos = 6;
    for (p = 0; p < 3; p++) {
        ix[p] = pld_index_new(min_n, max_n, (pld_policy)p);
        if (ix[p] == NULL)
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
    }
    for (p = 0; p < 3; p++) {
        if (pld_index_nbytes(ix[p]) == 0 && len > 0)
            abort();
        pld_index_free(ix[p]);
    }
    return 0;
}
