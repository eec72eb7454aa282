/*
 * check.h -- the assertion counters and the test generator shared by the
 * plain C test programs (test_core.c, test_corpus.c); one program includes
 * it once.
 *
 * CHECK(cond) counts one passed or failed assertion and prints the first 50
 * failures; CHECKF(cond, fmt, ...) adds a printf-style context line. A
 * program reports g_passed and g_failed at the end and exits nonzero if any
 * check failed. t_next() / t_below(n) are the test's own xorshift generator
 * (no generator of the core); t_state may be set to reseed it.
 */
#ifndef PLD_TESTS_CHECK_H
#define PLD_TESTS_CHECK_H

#include <stdint.h>
#include <stdio.h>

static long g_passed, g_failed;

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (cond) {                                                          \
            g_passed++;                                                      \
        } else {                                                             \
            g_failed++;                                                      \
            if (g_failed <= 50)                                              \
                fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__,      \
                        #cond);                                              \
        }                                                                    \
    } while (0)

#define CHECKF(cond, ...)                                                    \
    do {                                                                     \
        if (cond) {                                                          \
            g_passed++;                                                      \
        } else {                                                             \
            g_failed++;                                                      \
            if (g_failed <= 50) {                                            \
                fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__,      \
                        #cond);                                              \
                fprintf(stderr, __VA_ARGS__);                                \
                fputc('\n', stderr);                                         \
            }                                                                \
        }                                                                    \
    } while (0)

static uint64_t t_state = 0x9E3779B97F4A7C15ull;
static uint64_t t_next(void)
{
    uint64_t x = t_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    t_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}
static size_t t_below(size_t n) { return (size_t)(t_next() % n); }

#endif
