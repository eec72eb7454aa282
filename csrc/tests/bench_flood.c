/*
 * bench_flood.c -- timing evidence for hash flooding of the index (not a
 * test: it asserts nothing). Extends an index by N ids one call at a time,
 * ids >= 2^20 (outside the FIRST index's array of unigrams by id), either
 * random or crafted: the inverses of key-0 unigram tags that share their
 * low 16 bits, so under key 0 they all fall into one probe run. Prints the
 * cost per extended token for key 0 and for a random key.
 *
 *   make -C csrc flood       (or csrc/build/bench_flood N for N ids; 40000)
 *
 * Under key 0 (pld_index_new) the crafted ids cost O(len) each: the fixed
 * key is not for untrusted input. Under a random key they cost what random
 * ids cost.
 */
#define _POSIX_C_SOURCE 199309L
#include "pld.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The id whose key-0 unigram tag is x (inverse of the index's 32-bit mix). */
static uint32_t unmix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x43021123u;
    x ^= (x >> 15) ^ (x >> 30);
    x *= 0x1d69e2a5u;
    x ^= x >> 16;
    return x;
}

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ns per token of extending a fresh index by ids[0..n), one at a time. */
static double time_extend(const int64_t *ids, size_t n, pld_policy policy,
                          uint64_t key)
{
    double best = 1e30;
    int rep;
    for (rep = 0; rep < 3; rep++) {
        pld_index *ix = pld_index_new_keyed(1, 3, policy, key);
        double t0, t;
        size_t i;
        if (ix == NULL)
            abort();
        t0 = now();
        for (i = 0; i < n; i++)
            if (pld_index_extend(ix, ids + i, 1) != PLD_OK)
                abort();
        t = (now() - t0) * 1e9 / (double)n;
        if (t < best)
            best = t;
        pld_index_free(ix);
    }
    return best;
}

int main(int argc, char **argv)
{
    const size_t n = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 40000;
    int64_t *crafted = malloc(n * sizeof *crafted);
    int64_t *random_ids = malloc(n * sizeof *random_ids);
    const uint64_t keys[2] = {0, rnd() | 1};
    const char *pname[2] = {"FIRST", "RECENT"};
    size_t i, c = 0;
    uint32_t hi;
    int p, k;
    if (crafted == NULL || random_ids == NULL)
        return 1;
    /* tags (hi << 16) | 0x5a5a, inverted; ids below 2^20 are skipped */
    for (hi = 0; hi < 65536 && c < n; hi++) {
        const uint32_t id = unmix32((hi << 16) | 0x5a5au);
        if (id >= (1u << 20))
            crafted[c++] = id;
    }
    if (c < n) {
        fprintf(stderr, "only %zu crafted ids\n", c);
        return 1;
    }
    for (i = 0; i < n; i++)
        random_ids[i] = (int64_t)((1u << 20) + rnd() % (UINT32_MAX - (1u << 20)));
    printf("N=%zu ids >= 2^20, min_n=1 max_n=3, ns per extended token (best of 3)\n", n);
    printf("%-7s %-20s %10s %10s %8s\n", "policy", "key", "random", "crafted", "ratio");
    for (p = 0; p < 2; p++)
        for (k = 0; k < 2; k++) {
            const double r = time_extend(random_ids, n, (pld_policy)p, keys[k]);
            const double x = time_extend(crafted, n, (pld_policy)p, keys[k]);
            printf("%-7s 0x%016llx %10.1f %10.1f %8.2f\n", pname[p],
                   (unsigned long long)keys[k], r, x, x / r);
        }
    free(crafted);
    free(random_ids);
    return 0;
}
