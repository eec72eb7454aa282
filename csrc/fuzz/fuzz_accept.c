/*
 * fuzz_accept.c -- libFuzzer target for the tree acceptance functions:
 * random trees (parents anywhere in [-1, i), sometimes outside), tokens
 * with equal siblings, random choices, and probabilities with NaN, +-inf,
 * negative, subnormal values and raw bit patterns. Must never crash;
 * checks:
 *   depths:  pld_tree_depths agrees with ref_tree_depth (PLD_ERR_ARG
 *            exactly for a bad parent)
 *   greedy:  equals ref_tree_greedy; path[0..m) is a parent chain from the
 *            root (parents[path[0]] == -1, parents[path[j]] == path[j-1]),
 *            out[j] == nodes[path[j]] for j < m, out[j] is the choice at
 *            the position before (choices[0] or choices[1 + path[j-1]]),
 *            and no child of the last node (the root for m = 0) holds
 *            out[m]
 *   sample:  equals ref_tree_sample (PLD_ERR_VALUE exactly where the
 *            reference finds a bad visited row); the same chain and token
 *            invariants, every out[j] in [0, vocab) with positive mass in
 *            its row; too few uniforms, too few rows, vocab 0 or a bad
 *            type: PLD_ERR_ARG
 *
 * Input layout:
 *   [0] bits 0-1 ftype (3 = invalid), bit 2: bad rows, bit 3: one uniform
 *       too few, bits 4-7: value mode
 *   [1] n (mod 17)   [2] vocab (mod 9; 0 = invalid)   [3] tree shape
 *   then per node: parent byte, token byte; n + 1 choice bytes; 17
 *   uniform byte pairs; element bytes
 */
#include "pld.h"
#include "tests/naive_reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXN 16

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

/* The invariants every walk keeps, whatever chose its tokens. */
static void check_walk(const int64_t *nodes, const int64_t *parents, size_t n, const size_t *path,
                       const int64_t *out, size_t m)
{
    int64_t node = -1;
    size_t j, c;
    if (m > n)
        abort();
    for (j = 0; j < m; j++) {
        if (path[j] >= n || parents[path[j]] != node || nodes[path[j]] != out[j])
            abort();
        for (c = (size_t)(node + 1); c < path[j]; c++) /* no earlier sibling with the token */
            if (parents[c] == node && nodes[c] == out[j])
                abort();
        node = (int64_t)path[j];
    }
    for (c = (size_t)(node + 1); c < n; c++) /* the last token matches no child */
        if (parents[c] == node && nodes[c] == out[m])
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int64_t nodes[MAXN], parents[MAXN], choices[MAXN + 1], out[MAXN + 1], want[MAXN + 1];
    size_t path[MAXN], wpath[MAXN], depths[MAXN], n, vocab, rows, i, m = 99, d = 99, esz, nu;
    double u[MAXN + 1];
    int bad_ft, bad_rows, short_u, vmode, shape;
    long depth, rm;
    pld_float_type ft;
    unsigned char *buf;
    pld_status st;
    if (size < 4)
        return 0;
    g_data = data;
    g_size = size;
    g_pos = 4;
    bad_ft = (data[0] & 3) == 3;
    ft = (pld_float_type)(data[0] & 3);
    bad_rows = data[0] >> 2 & 1;
    short_u = data[0] >> 3 & 1;
    vmode = data[0] >> 4;
    n = data[1] % (MAXN + 1);
    vocab = data[2] % 9;
    shape = data[3] % 4; /* 0 chain, 1 any parent, 2 bushy (root heavy), 3 raw byte */
    for (i = 0; i < n; i++) {
        const uint8_t b = next_byte();
        switch (shape) {
        case 0: parents[i] = (int64_t)i - 1; break;
        case 1: parents[i] = (int64_t)(b % (i + 1)) - 1; break;
        case 2: parents[i] = b % 2 ? -1 : (int64_t)(b % (i + 1)) - 1; break;
        default: parents[i] = (int64_t)(int8_t)b; break; /* may be outside [-1, i) */
        }
        nodes[i] = (int64_t)(next_byte() % (vocab + 2)) - 1; /* -1 and >= vocab too */
    }
    for (i = 0; i <= n; i++)
        choices[i] = (int64_t)(next_byte() % (vocab + 2)) - 1;
    for (i = 0; i <= MAXN; i++)
        u[i] = next_byte() / 256.0 + next_byte() / 65536.0;

    depth = ref_tree_depth(parents, n);
    st = pld_tree_depths(parents, n, depths, &d);
    if ((depth < 0) != (st == PLD_ERR_ARG) || (depth >= 0 && (st != PLD_OK || d != (size_t)depth)))
        abort();

    /* greedy */
    st = pld_accept_tree_greedy(nodes, parents, n, choices, path, out, &m);
    if (depth < 0) {
        if (st != PLD_ERR_ARG)
            abort();
    } else {
        size_t wm = ref_tree_greedy(nodes, parents, n, choices, wpath, want);
        if (st != PLD_OK || m != wm || memcmp(path, wpath, m * sizeof *path) ||
            memcmp(out, want, (m + 1) * sizeof *out))
            abort();
        check_walk(nodes, parents, n, path, out, m);
        for (i = 0; i <= m; i++) /* each token is the choice at its position */
            if (out[i] != choices[i == 0 ? 0 : path[i - 1] + 1])
                abort();
    }

    /* sampling */
    esz = ft == PLD_F32 || bad_ft ? 4 : 2;
    rows = bad_rows ? n : n + 1 + (data[3] >> 2 & 1);
    buf = malloc(rows * (vocab ? vocab : 1) * esz + 1);
    if (buf == NULL)
        return 0;
    for (i = 0; i < rows * vocab; i++)
        put(buf, bad_ft ? PLD_F32 : ft, i, vmode);
    nu = depth < 0 ? 1 : (size_t)depth + 1 - (size_t)short_u;
    m = 99;
    st = pld_accept_tree_sample(nodes, parents, n, buf, ft, rows, vocab, u, nu, path, out, &m);
    if (depth < 0 || bad_ft || bad_rows || vocab == 0 || short_u) {
        if (st != PLD_ERR_ARG)
            abort();
        free(buf);
        return 0;
    }
    rm = ref_tree_sample(nodes, parents, n, buf, ft, vocab, u, wpath, want);
    if (rm < 0) {
        if (st != PLD_ERR_VALUE)
            abort();
        free(buf);
        return 0;
    }
    if (st != PLD_OK || m != (size_t)rm || memcmp(path, wpath, m * sizeof *path) ||
        memcmp(out, want, (m + 1) * sizeof *out))
        abort();
    check_walk(nodes, parents, n, path, out, m);
    for (i = 0; i <= m; i++) { /* a drawn token has positive mass in its row */
        const size_t row = i == 0 ? 0 : path[i - 1] + 1;
        if (out[i] < 0 || out[i] >= (int64_t)vocab ||
            !(ref_elem(buf, ft, row * vocab + (size_t)out[i]) > 0))
            abort();
    }
    free(buf);
    return 0;
}
