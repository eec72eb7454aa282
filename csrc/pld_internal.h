/*
 * pld_internal.h -- what the core's files share beyond pld.h. Not part of
 * the API: no caller outside csrc/pld_*.c uses these.
 */
#ifndef PLD_INTERNAL_H
#define PLD_INTERNAL_H

#include "pld.h"

/* count * size bytes of zeros, written rather than calloc'ed, or NULL
 * (out of memory, or the product overflows); free() releases it. A fresh
 * calloc'ed mapping reads as the shared zero page until written, so the
 * first read and then write of each page take two faults (the second a
 * copy-on-write one, with a TLB shootdown across the process's threads):
 * in a table's rehash, or in the middle of a decoding step. Written here,
 * the pages fault once, now. Blocks of 2 MiB or more are 2 MiB-aligned
 * and ask for transparent huge pages (on Linux), since every probe of a
 * table larger than the caches is a TLB miss too. */
void *pld_alloc_written(size_t count, size_t size);

/* A token trie being built by one propose_tree call (pld.h, "Token
 * tree"): nodes[0..n_nodes) in creation order, at most max_nodes. */
typedef struct {
    pld_tree_node *nodes;
    size_t n_nodes, max_nodes;
    int32_t root_first;   /* the root's first child; -1: none */
    const int64_t *eos;   /* candidates are cut before these */
    size_t n_eos;
} pld_trie;

/* Start a trie on out[0..n_nodes), nodes already there kept (n_nodes 0: a
 * fresh one). PLD_ERR_ARG if n_nodes > max_nodes or out[0..n_nodes) is not
 * a trie as pld_trie_insert writes one (each parent before its node, each
 * first child and next sibling after it): then t is a fresh, empty trie on
 * out. */
pld_status pld_trie_open(pld_trie *t, pld_tree_node *out, size_t n_nodes, size_t max_nodes,
                         const int64_t *eos, size_t n_eos);

/* Merge the candidate tokens[0..count), found by an n-gram of size n,
 * into the trie: it is cut before its first eos id; a token already a
 * child of the current node is shared, another becomes a new node (ngram
 * n, appended after its siblings) unless the trie is full, which ends the
 * candidate. Every node on its inserted path counts it in support. */
void pld_trie_insert(pld_trie *t, const int64_t *tokens, size_t count, uint32_t n);

/* The continuation starts i + n of the occurrences i of key[0..n) in the
 * index's sequence with i + n < len, into starts[0..): under RECENT the
 * newest `max` of them, newest first; under FIRST and FREQUENT the
 * earliest one (at most one). Returns their number. Requires
 * min_n <= n <= max_n and max >= 1. O(n + max). */
size_t pld_index_continuations(const pld_index *index, const int64_t *key, size_t n,
                               size_t max, size_t *starts);

/* One query of pld_index_continuations_many: index, key and n are the
 * caller's; found and starts[0..found) are the answer; the rest is the
 * batch's own. */
typedef struct {
    const pld_index *index;
    const int64_t *key;
    size_t n;
    size_t found;
    size_t starts[PLD_TREE_MAX_PER_NGRAM];
    uint32_t tag, cur; /* private */
} pld_probe;

/* At most this many probes a batch. */
#define PLD_PROBE_BATCH 16

/* For each of probes[0..count): found = pld_index_continuations(index,
 * key, n, max, starts), the same answer, but the batch's memory reads
 * overlap: every probe's home slot is fetched before any is read, and
 * each step down the RECENT chains of occurrences fetches the next step of
 * all of them before it reads one. Requires count <= PLD_PROBE_BATCH, and
 * for each probe min_n <= n <= max_n and 1 <= max <= PLD_TREE_MAX_PER_NGRAM.
 * Reads the indexes only. */
void pld_index_continuations_many(pld_probe *probes, size_t count, size_t max);

/* Trim the sequence's arrays to its length (nothing else changes; on a
 * failed reallocation they simply stay as they are). A later extend grows
 * them again. */
void pld_index_shrink_to_fit(pld_index *index);

#endif /* PLD_INTERNAL_H */
