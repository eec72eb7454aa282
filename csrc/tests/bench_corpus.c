/*
 * bench_corpus.c -- the corpus lookup's time in C alone, without the
 * Python binding (not a test: it asserts nothing). For each corpus size
 * it builds a pld_corpus (4 segments, n-grams 2..4) over a text-like
 * synthetic stream -- Zipf-distributed ids over 49,152, a third of them
 * overwritten by phrases from a bank of 20,000, in sequences of 64..1023
 * tokens -- then times pld_corpus_propose_tree (depth 8, 4 a n-gram, at
 * most 64 nodes) on 8-token contexts cut from the newest sequences, one
 * call at a time, and prints the median and p90 per call, the mean trie,
 * the median time per trie node, and the median time of as many calls
 * whose context matches nothing (ids above the vocabulary: the probes of
 * every segment and n-gram size, alone), alternating with the others.
 *
 *   make -C csrc corpus-bench   (or csrc/build/bench_corpus [CALLS [SIZE ...]])
 *
 * The same stream for the same sizes, so two builds of the core compare
 * side by side (run them alternately; the machine's noise is yours).
 */
#define _POSIX_C_SOURCE 199309L
#include "pld.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VOCAB 49152
#define BANK 20000
#define DEPTH 8
#define PER_NGRAM 4
#define MAX_NODES 64
#define CONTEXT 8

static uint64_t rng_state;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double unit(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }

static size_t below(size_t n) { return (size_t)(unit() * (double)n); }

/* Ranks 0..n-1 with P(rank k) proportional to (k + 1)^-s: the CDF, searched. */
typedef struct {
    double *cdf;
    size_t n;
} zipf_t;

static zipf_t zipf_new(size_t n, double s)
{
    zipf_t z = {malloc(n * sizeof(double)), n};
    double total = 0;
    size_t k;
    if (z.cdf == NULL)
        abort();
    for (k = 0; k < n; k++)
        z.cdf[k] = (total += pow((double)(k + 1), -s));
    for (k = 0; k < n; k++)
        z.cdf[k] /= total;
    return z;
}

static size_t zipf_draw(const zipf_t *z)
{
    const double u = unit();
    size_t lo = 0, hi = z->n - 1;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (z->cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* n text-like ids (see the top of the file). */
static int64_t *make_stream(size_t n, uint64_t seed)
{
    int64_t *s = malloc(n * sizeof(int64_t)), *perm = malloc(VOCAB * sizeof(int64_t));
    int64_t *bank[BANK];
    size_t bank_len[BANK], i, pos = 0;
    zipf_t ids = zipf_new(VOCAB, 1.1), phrases = zipf_new(BANK, 1.2);
    if (s == NULL || perm == NULL)
        abort();
    rng_state = seed;
    for (i = 0; i < VOCAB; i++)
        perm[i] = (int64_t)i;
    for (i = VOCAB - 1; i > 0; i--) {
        const size_t j = below(i + 1);
        const int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (i = 0; i < n; i++)
        s[i] = perm[zipf_draw(&ids)];
    for (i = 0; i < BANK; i++) {
        size_t k;
        bank_len[i] = 4 + below(21);
        bank[i] = malloc(bank_len[i] * sizeof(int64_t));
        if (bank[i] == NULL)
            abort();
        for (k = 0; k < bank_len[i]; k++)
            bank[i][k] = perm[zipf_draw(&ids)];
    }
    for (;;) {
        const size_t pick = zipf_draw(&phrases);
        pos += below(48);
        if (pos + bank_len[pick] > n)
            break;
        memcpy(s + pos, bank[pick], bank_len[pick] * sizeof(int64_t));
        pos += bank_len[pick];
    }
    for (i = 0; i < BANK; i++)
        free(bank[i]);
    free(perm);
    free(ids.cdf);
    free(phrases.cdf);
    return s;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void time_size(size_t size, size_t calls)
{
    int64_t *stream = make_stream(size, 0x243F6A8885A308D3ull ^ size);
    pld_corpus *c = pld_corpus_new(size, 2, 4, 4, 12345);
    pld_tree_node nodes[MAX_NODES];
    double *per_call = malloc(calls * sizeof(double)), *per_node = malloc(calls * sizeof(double));
    double *per_miss = malloc(calls * sizeof(double));
    int64_t miss[CONTEXT];
    size_t *ctx_at = malloc(calls * sizeof(size_t)), pos = 0, i, k, total_nodes = 0;
    size_t tail_from;
    double t0, build;
    if (c == NULL || per_call == NULL || per_node == NULL || per_miss == NULL || ctx_at == NULL)
        abort();
    t0 = now();
    while (pos < size) {
        size_t len = 64 + below(960);
        if (len > size - pos)
            len = size - pos;
        if (pld_corpus_add(c, stream + pos, len) != PLD_OK)
            abort();
        pos += len;
    }
    build = now() - t0;
    /* contexts end anywhere in the newest 2M tokens (all of a smaller corpus) */
    tail_from = size > 2000000 ? size - 2000000 : 0;
    for (i = 0; i < calls; i++)
        ctx_at[i] = tail_from + CONTEXT + below(size - tail_from - CONTEXT);
    for (i = 0; i < calls && i < 50; i++) { /* warm-up */
        size_t got;
        (void)pld_corpus_propose_tree(c, stream + ctx_at[i] - CONTEXT, CONTEXT, DEPTH, PER_NGRAM,
                                      MAX_NODES, NULL, 0, nodes, &got);
    }
    for (i = 0; i < calls; i++) {
        size_t got = 0;
        double t;
        t0 = now();
        (void)pld_corpus_propose_tree(c, stream + ctx_at[i] - CONTEXT, CONTEXT, DEPTH, PER_NGRAM,
                                      MAX_NODES, NULL, 0, nodes, &got);
        t = now() - t0;
        per_call[i] = t;
        per_node[i] = t / (double)(got ? got : 1);
        total_nodes += got;
        for (k = 0; k < CONTEXT; k++)
            miss[k] = VOCAB + (int64_t)below(1000000);
        t0 = now();
        (void)pld_corpus_propose_tree(c, miss, CONTEXT, DEPTH, PER_NGRAM, MAX_NODES, NULL, 0,
                                      nodes, &got);
        per_miss[i] = now() - t0;
    }
    qsort(per_call, calls, sizeof(double), by_value);
    qsort(per_node, calls, sizeof(double), by_value);
    qsort(per_miss, calls, sizeof(double), by_value);
    printf("| %10zu | %8.2f | %11.3f | %8.3f | %10.1f | %11.3f | %13.3f | %8.1f |\n", size, build,
           1e6 * per_call[calls / 2], 1e6 * per_call[calls * 9 / 10],
           (double)total_nodes / (double)calls, 1e6 * per_node[calls / 2], 1e6 * per_miss[calls / 2],
           (double)pld_corpus_nbytes(c) / (double)pld_corpus_tokens(c));
    fflush(stdout);
    pld_corpus_free(c);
    free(stream);
    free(per_call);
    free(per_node);
    free(per_miss);
    free(ctx_at);
}

int main(int argc, char **argv)
{
    static const size_t sizes[] = {1000, 10000, 100000, 1000000, 10000000};
    const size_t calls = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : 20000;
    int i;
    if (calls < 1) {
        fprintf(stderr, "usage: %s [CALLS >= 1 [SIZE ...]]\n", argv[0]);
        return 2;
    }
    printf("| corpus tokens | build (s) | median (us) | p90 (us) | mean nodes | us per node "
           "| no match (us) | B/token |\n|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    if (argc > 2)
        for (i = 2; i < argc; i++)
            time_size((size_t)strtoull(argv[i], NULL, 10), calls);
    else
        for (i = 0; i < (int)(sizeof(sizes) / sizeof(sizes[0])); i++)
            time_size(sizes[i], calls);
    return 0;
}
