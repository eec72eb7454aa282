/*
 * fuzz_accept.c -- libFuzzer target for the acceptance functions: random
 * shapes and values (NaN, +-inf, negative, subnormal, raw bit patterns).
 * Must never crash; checks:
 *   greedy ids:    n equals the naive longest agreeing prefix
 *   greedy logits: n and out[0..n] equal a naive argmax loop (first max,
 *                  NaN is the max); the buffer holds only the rows the scan
 *                  may read, so ASan catches an over-read
 *   sample:        n <= k, out[0..n] in [0, vocab), out[i] == draft[i] for
 *                  i < n, a rejected draft token is not redrawn, the drawn
 *                  token has positive mass; PLD_ERR_VALUE only with a bad
 *                  row; clearly-decided accept/reject tests agree
 *   bad sizes:     PLD_ERR_ARG
 *
 * Input layout:
 *   [0] mode (0 ids, 1 logits, 2 sample) and ftype (bits 2-3; 3 = invalid)
 *   [1] vocab (mod 40; 0 = invalid)   [2] k (mod 9)
 *   [3] bit 0: rows = k (invalid), bits 1-2: extra rows, bits 4-7: value mode
 *   then draft bytes (k), uniform bytes (k + 1), element bytes
 */
#include "pld.h"
#include "tests/naive_reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t *g_data;
static size_t g_size, g_pos;
static uint8_t next_byte(void) { return g_pos < g_size ? g_data[g_pos++] : 0; }

/* Fill one element from the input according to the value mode. */
static void put(unsigned char *buf, pld_float_type ft, size_t i, int mode)
{
    static const float specials[] = {0.0f, -0.0f, 1.0f, 2.0f, 0.5f, -1.0f,
                                     1e-40f, 3e38f, NAN, INFINITY, -INFINITY,
                                     1e-3f, 7.0f, 0.25f, 0.0f, 1.0f};
    static const uint16_t h_specials[] = {0x0000, 0x8000, 0x3C00, 0x4000,
                                          0x3800, 0xBC00, 0x0001, 0x7BFF,
                                          0x7E00, 0x7C00, 0xFC00, 0x1400,
                                          0x4700, 0x3400, 0x0000, 0x3C00};
    static const uint16_t b_specials[] = {0x0000, 0x8000, 0x3F80, 0x4000,
                                          0x3F00, 0xBF80, 0x0001, 0x7F7F,
                                          0x7FC0, 0x7F80, 0xFF80, 0x3A83,
                                          0x40E0, 0x3E80, 0x0000, 0x3F80};
    uint8_t b0 = next_byte();
    if (ft == PLD_F32) {
        float f;
        if (mode == 0) { /* raw bits */
            uint32_t u = (uint32_t)b0 | (uint32_t)next_byte() << 8 |
                         (uint32_t)next_byte() << 16 | (uint32_t)next_byte() << 24;
            memcpy(&f, &u, 4);
        } else if (mode < 8) {
            f = specials[b0 % 16];
        } else { /* clean, non-negative, small integers */
            f = (float)(b0 % 4);
        }
        memcpy(buf + 4 * i, &f, 4);
    } else {
        uint16_t h;
        if (mode == 0)
            h = (uint16_t)(b0 | next_byte() << 8);
        else if (mode < 8)
            h = ft == PLD_F16 ? h_specials[b0 % 16] : b_specials[b0 % 16];
        else
            h = (uint16_t)(b0 % 4 == 0 ? 0
                           : (ft == PLD_F16 ? 0x3C00 : 0x3F80) + (b0 % 4 - 1) * 0x80);
        memcpy(buf + 2 * i, &h, 2);
    }
}

static int row_clean(const void *p, pld_float_type ft, size_t row, size_t vocab,
                     int64_t exclude, double *sum_out)
{
    double sum = 0, rest = 0;
    size_t j;
    for (j = 0; j < vocab; j++) {
        float v = ref_elem(p, ft, row * vocab + j);
        if (isnan(v) || isinf(v) || v < 0)
            return 0;
        sum += v;
        if ((int64_t)j != exclude)
            rest += v;
    }
    *sum_out = sum;
    return sum > 0 && rest > 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int64_t draft[9], chosen[9], out[10], want[9];
    double u[9];
    size_t vocab, k, rows, i, n = 77, want_n, esz, nelem;
    int mode, vmode, bad_ft, bad_rows;
    pld_float_type ft;
    unsigned char *buf;
    pld_status st;
    if (size < 4)
        return 0;
    g_data = data;
    g_size = size;
    g_pos = 4;
    mode = data[0] % 3;
    bad_ft = (data[0] >> 2 & 3) == 3;
    ft = bad_ft ? (pld_float_type)(3 + (data[0] >> 4)) : (pld_float_type)(data[0] >> 2 & 3);
    vocab = data[1] % 40;
    k = data[2] % 9;
    bad_rows = data[3] & 1;
    rows = bad_rows ? k : k + 1 + (data[3] >> 1 & 3);
    vmode = data[3] >> 4;
    for (i = 0; i < k; i++) {
        uint8_t b = next_byte();
        draft[i] = (int64_t)(b % (vocab + 3)) - 1; /* -1 and >= vocab too */
        if (b == 255)
            draft[i] = INT64_MIN;
        chosen[i] = (int64_t)(next_byte() % 2 ? draft[i] : b % 5);
    }
    chosen[k] = next_byte();
    for (i = 0; i <= k; i++)
        u[i] = next_byte() / 256.0 + next_byte() / 65536.0;

    if (mode == 0) {
        size_t m = 0, got = pld_accept_greedy_ids(draft, k, chosen);
        while (m < k && draft[m] == chosen[m])
            m++;
        if (got != m)
            abort();
        return 0;
    }

    esz = (ft == PLD_F32 || bad_ft) ? 4 : 2;
    nelem = rows * vocab;
    buf = malloc(nelem * esz + 1);
    if (buf == NULL)
        return 0;
    for (i = 0; i < nelem; i++)
        put(buf, bad_ft ? PLD_F32 : ft, i, vmode);
    for (i = 0; i < 10; i++)
        out[i] = -999;

    if (mode == 1) {
        if (bad_ft || vocab == 0 || bad_rows) {
            st = pld_accept_greedy_logits(buf, ft, rows, vocab, draft, k, out, &n);
            if (st != PLD_ERR_ARG)
                abort();
            free(buf);
            return 0;
        }
        for (i = 0; i <= k; i++)
            want[i] = ref_argmax(buf, ft, i, vocab);
        want_n = 0;
        while (want_n < k && draft[want_n] == want[want_n])
            want_n++;
        { /* only the rows the scan may read */
            unsigned char *exact = malloc((want_n + 1) * vocab * esz);
            if (exact == NULL)
                abort();
            memcpy(exact, buf, (want_n + 1) * vocab * esz);
            st = pld_accept_greedy_logits(exact, ft, rows, vocab, draft, k, out, &n);
            free(exact);
        }
        if (st != PLD_OK || n != want_n)
            abort();
        for (i = 0; i <= n; i++)
            if (out[i] != want[i])
                abort();
        free(buf);
        return 0;
    }

    /* mode 2: sampling */
    st = pld_accept_sample(buf, ft, rows, vocab, draft, k, u, out, &n);
    if (bad_ft || vocab == 0 || bad_rows) {
        if (st != PLD_ERR_ARG)
            abort();
        free(buf);
        return 0;
    }
    if (st == PLD_OK) {
        double sum, p;
        if (n > k)
            abort();
        for (i = 0; i <= n; i++)
            if (out[i] < 0 || out[i] >= (int64_t)vocab)
                abort();
        for (i = 0; i < n; i++)
            if (out[i] != draft[i])
                abort();
        /* the drawn token has positive mass and is not the rejected one */
        if (!(ref_elem(buf, ft, n * vocab + (size_t)out[n]) > 0))
            abort();
        if (n < k && out[n] == draft[n])
            abort();
        /* clearly decided tests (away from rounding) must agree */
        for (i = 0; i <= n && i < k; i++) {
            if (!row_clean(buf, ft, i, vocab, -1, &sum))
                abort(); /* a bad row was read yet the call succeeded */
            p = (draft[i] >= 0 && draft[i] < (int64_t)vocab)
                    ? ref_elem(buf, ft, i * vocab + (size_t)draft[i]) : 0.0;
            if (i < n && u[i] * sum > p * (1 + 1e-5) + 1e-300)
                abort(); /* accepted although clearly rejected */
            if (i == n && u[i] * sum < p * (1 - 1e-5))
                abort(); /* rejected although clearly accepted */
        }
    } else if (st == PLD_ERR_VALUE) {
        /* Some row among 0..k must be bad (or have no mass left after its
         * draft token is removed). */
        int any_bad = 0;
        for (i = 0; i <= k && !any_bad; i++) {
            double sum;
            any_bad = !row_clean(buf, ft, i, vocab, i < k ? draft[i] : -1, &sum);
        }
        if (!any_bad)
            abort();
    } else {
        abort();
    }
    free(buf);
    return 0;
}
