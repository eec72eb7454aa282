/*
 * pld.h -- the C core of pld: prompt lookup decoding over raw token buffers.
 *
 * No Python in here. Every function works on (pointer, length) pairs that the
 * caller owns; nothing keeps a pointer to caller memory after it returns,
 * except where a contract says otherwise. Functions that can fail return a
 * pld_status; the rest cannot fail for arguments within their contract.
 *
 * Vocabulary:
 *   L        length of the token sequence (the context so far)
 *   n        an n-gram size; the "suffix n-gram" is tokens[L-n .. L-1]
 *   k        the number of draft tokens asked for (num_pred_tokens)
 *   draft    the tokens proposed to follow the sequence
 */
#ifndef PLD_H
#define PLD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    PLD_OK = 0,
    PLD_ERR_NOMEM = -1,    /* an allocation failed; the object is unchanged */
    PLD_ERR_ARG = -2,      /* an argument is outside its contract */
    PLD_ERR_OVERFLOW = -3, /* a size would exceed what the core can index */
    PLD_ERR_VALUE = -4     /* numeric input is invalid (NaN, negative mass) */
} pld_status;

/* ------------------------------------------------------------------------
 * Lookup semantics
 * ------------------------------------------------------------------------
 * PLD_SEED (the method's find_candidate_pred_tokens): for n from max_n down
 *   to min_n (skipping n > L), take the EARLIEST occurrence i of the suffix
 *   n-gram. It is valid iff its full continuation fits (i + n + k <= L) and
 *   it is not the trailing self-match (i + n < L - n). A valid match yields
 *   tokens[i+n .. i+n+k-1]; an invalid earliest occurrence moves on to the
 *   next smaller n (a later occurrence of the same n is never valid when the
 *   earliest is not). No valid n: an empty draft.
 *
 * PLD_TRANSFORMERS (transformers' PromptLookupCandidateGenerator, without
 *   logits processors): if max_length == L + 1 the draft is empty. For n
 *   from min(max_n, L - 1) down to min_n, the earliest occurrence i gives
 *   start = i + n and end = min(start + k, L, max_length); the first n with
 *   start < end wins: the draft is tokens[start .. end-1], cut before its
 *   first token that is in eos[]; a draft cut to nothing is empty (no
 *   further n is tried).
 */
/* The largest n-gram size any function accepts. */
#define PLD_MAX_NGRAM 64

typedef enum { PLD_SEED = 0, PLD_TRANSFORMERS = 1 } pld_semantics;

typedef struct {
    pld_semantics semantics;
    int64_t max_length;  /* PLD_TRANSFORMERS only; < 0 means no limit */
    const int64_t *eos;  /* PLD_TRANSFORMERS only; may be NULL when n_eos 0 */
    size_t n_eos;
} pld_lookup_opts;

/* Scan tokens[0..len) once (O(len * max_n) worst case, O(len) typically) and
 * place the draft as a slice of the input: *start and *count (count 0: no
 * draft). Requires 1 <= min_n <= max_n <= PLD_MAX_NGRAM, k >= 1, opts != NULL. Returns
 * PLD_ERR_ARG otherwise. Reads tokens only; allocates nothing. */
pld_status pld_find_candidate_i64(const int64_t *tokens, size_t len,
                                  size_t min_n, size_t max_n, size_t k,
                                  const pld_lookup_opts *opts,
                                  size_t *start, size_t *count);
pld_status pld_find_candidate_i32(const int32_t *tokens, size_t len,
                                  size_t min_n, size_t max_n, size_t k,
                                  const pld_lookup_opts *opts,
                                  size_t *start, size_t *count);

/* ------------------------------------------------------------------------
 * Incremental n-gram index over one growing sequence
 * ------------------------------------------------------------------------
 * The index owns a copy of the sequence (int64). For each n in
 * [min_n, max_n] it keeps a hash table from n-gram to one position, updated
 * as tokens arrive, so extend costs O(max_n) per token (amortised over table
 * growth) and propose costs O(k) for PLD_POLICY_FIRST -- independent of L.
 *
 * Policies:
 *   PLD_POLICY_FIRST     earliest occurrence: proposals equal
 *                        pld_find_candidate_* on the same sequence, under
 *                        both semantics.
 *   PLD_POLICY_RECENT    the same rules, but the LATEST valid occurrence of
 *                        the suffix n-gram wins. O(k + n) per propose.
 *   PLD_POLICY_FREQUENT  the draft is built token by token: the next token
 *                        is the most frequent follower of the longest suffix
 *                        n-gram (of sequence + draft so far) that has one;
 *                        a tie goes to the follower that reached the count
 *                        first. Stops at k tokens or when no n-gram has a
 *                        follower. Under PLD_TRANSFORMERS the draft is cut
 *                        before the first eos and to at most
 *                        max_length - L - 1 tokens. O(k * max_n) per propose.
 *
 * Sizes: at most PLD_INDEX_MAX_TOKENS tokens (positions are 32-bit).
 */
#define PLD_INDEX_MAX_TOKENS ((size_t)UINT32_MAX - 2u)

typedef enum {
    PLD_POLICY_FIRST = 0,
    PLD_POLICY_RECENT = 1,
    PLD_POLICY_FREQUENT = 2
} pld_policy;

typedef struct pld_index pld_index;

/* A new empty index; NULL if 1 <= min_n <= max_n <= PLD_MAX_NGRAM does not
 * hold, the policy is unknown, or memory runs out. Free with
 * pld_index_free.
 *
 * The hash of every table (the tags of n-grams and of unigrams, and all
 * that derives from them: home slots, the presence filter) is keyed by
 * `key`. Proposals do not depend on it; only speed does. Under a key the
 * input's author does not know, no set of ids collides in the tables more
 * than chance would have it; under a known key, crafted ids can share one
 * probe run and make each extend cost O(len). So take a random key for
 * untrusted input (the Python binding does by default).
 *
 * pld_index_new(min_n, max_n, policy) is pld_index_new_keyed(min_n, max_n,
 * policy, 0): a fixed key, so table layouts and timings are reproducible.
 * NOT for untrusted input. */
pld_index *pld_index_new(size_t min_n, size_t max_n, pld_policy policy);
pld_index *pld_index_new_keyed(size_t min_n, size_t max_n, pld_policy policy,
                               uint64_t key);
void pld_index_free(pld_index *index); /* NULL is fine */

/* Append count tokens (copied). On error the index is left as it was before
 * the call for PLD_ERR_OVERFLOW; after PLD_ERR_NOMEM it holds a prefix of
 * the new tokens and stays consistent. */
pld_status pld_index_extend(pld_index *index, const int64_t *tokens,
                            size_t count);
pld_status pld_index_extend_i32(pld_index *index, const int32_t *tokens,
                                size_t count);

/* Make room for `extra` more tokens: afterwards, extending by up to extra
 * tokens in total (in any number of calls) never rehashes, so each
 * single-token extend costs O(max_n) in the worst case, not only
 * amortised; it allocates nothing either, with one exception: under FIRST
 * with min_n == 1, the array of unigrams by id is created once the
 * sequence is longer than it would be (checked as the length doubles), and
 * an id in [0, 2^20) above every id seen so far grows it (doubling it: at
 * most 10 times in the index's life, as the ids of a vocabulary arrive). A generation loop reserves prompt + max_new_tokens
 * before its first step. Costs O(current table sizes) when a table grows.
 * PLD_ERR_OVERFLOW if len + extra would exceed PLD_INDEX_MAX_TOKENS;
 * PLD_ERR_NOMEM leaves the index consistent (possibly partly grown). A
 * truncate does not shrink what was reserved. */
pld_status pld_index_reserve(pld_index *index, size_t extra);

/* Keep the first new_len tokens (new_len >= len is a no-op). Costs
 * O((len - new_len) * max_n) for FIRST and RECENT; FREQUENT rebuilds its
 * tables from the kept tokens, O(new_len * max_n). */
pld_status pld_index_truncate(pld_index *index, size_t new_len);

/* Write the draft (at most k tokens) to out[0..k) and return its length.
 * out must hold k tokens; k may be 0. opts as for pld_find_candidate_*. */
size_t pld_index_propose(const pld_index *index, size_t k,
                         const pld_lookup_opts *opts, int64_t *out);

/* pld_index_propose, and *ngram (if not NULL) receives the size of the
 * n-gram match behind the draft: the matched suffix size for FIRST and
 * RECENT, the size that gave the first token for FREQUENT; 0 when the draft
 * is empty. A caller can weigh drafts by it: longer matches are accepted
 * more often. */
size_t pld_index_propose_n(const pld_index *index, size_t k,
                           const pld_lookup_opts *opts, int64_t *out,
                           size_t *ngram);

/* The most occurrences that vote on a draft (pld_index_propose_voted). */
#define PLD_MAX_VOTERS 16

/* pld_index_propose_n, where under RECENT the newest `voters` valid
 * occurrences of the matched suffix n-gram vote on the draft, token by
 * token: the n-gram size is the one RECENT matches with (the largest with a
 * valid occurrence), and the voters are its valid occurrences, newest first
 * (the one RECENT drafts from, then the ones before it), at most voters,
 * each with the continuation RECENT would draft from it (its slice by the
 * shared rules). At depth d the voters whose continuation has a token d
 * vote with it; the token most of them give is drafted (a tie goes to the
 * newest voter's), and only the voters that gave it go on. The draft ends
 * at k tokens or when no voter is left, and is then cut before its first
 * eos (PLD_TRANSFORMERS). *ngram as for pld_index_propose_n.
 *
 * voters 0 or 1, or a FIRST or FREQUENT index: pld_index_propose_n.
 * voters above PLD_MAX_VOTERS count as PLD_MAX_VOTERS. Under PLD_SEED every
 * valid continuation holds k tokens, so a draft is k tokens or none, as
 * RECENT's. Cost: O(k + n) to find the match, as RECENT, and O(voters *
 * (k + voters)) to vote, independent of L. Text that repeats (a list, a
 * template, a summary quoting its source) draws the draft its repeats
 * share, where RECENT takes whatever followed the newest. */
size_t pld_index_propose_voted(const pld_index *index, size_t k, size_t voters,
                               const pld_lookup_opts *opts, int64_t *out,
                               size_t *ngram);

/* ------------------------------------------------------------------------
 * Token tree: several candidate continuations, merged
 * ------------------------------------------------------------------------
 * pld_index_propose_tree gathers continuations of the sequence's suffix
 * from several earlier occurrences and merges them into a trie (shared
 * prefixes once). Candidates, in this order: for n from min(max_n, len)
 * down to min_n, the occurrences i of the suffix n-gram (i < len - n):
 *   1. the earliest one (the method's own match);
 *   2. RECENT only: of the newest per_ngram + 1 occurrences (the suffix
 *      itself first), those other than the suffix and the earliest, newest
 *      first, until per_ngram occurrences of this n are taken.
 * An occurrence whose continuation starts where an earlier candidate's did
 * (the same text, matched by a longer n-gram) is skipped. A candidate is
 * tokens[i+n .. min(i+n+depth, len)), cut before its first token in
 * eos[0..n_eos). It is inserted from the root: a token already a child of
 * the current node is shared, another becomes a new node -- unless the
 * trie holds max_nodes nodes, which ends that candidate. Every node on a
 * candidate's inserted path counts it in `support`.
 *
 * Nodes are written in creation order (a parent before its children), and
 * children are linked in creation order. Cost: O(max_n * per_ngram *
 * (depth + max_nodes)) at worst, independent of len.
 */
#define PLD_TREE_MAX_PER_NGRAM 16
#define PLD_TREE_MAX_NODES 4096

typedef struct {
    int64_t token;
    int32_t parent;       /* the parent's index; -1: a child of the root (the
                           * sequence's last token) */
    int32_t first_child;  /* -1: none */
    int32_t next_sibling; /* -1: none */
    uint32_t depth;       /* 1 for a child of the root */
    uint32_t ngram;       /* the n of the candidate that created the node
                           * (the largest n among those through it) */
    uint32_t support;     /* candidates through the node */
} pld_tree_node;

/* The trie described above into out[0..*n_nodes). Requires depth >= 1,
 * 1 <= per_ngram <= PLD_TREE_MAX_PER_NGRAM, max_nodes <=
 * PLD_TREE_MAX_NODES, out holding max_nodes nodes (may be NULL when 0),
 * eos NULL only when n_eos is 0; PLD_ERR_ARG otherwise (*n_nodes = 0).
 * FIRST and FREQUENT give one candidate per n (the earliest). Reads the
 * index only. */
pld_status pld_index_propose_tree(const pld_index *index, size_t depth, size_t per_ngram,
                                  size_t max_nodes, const int64_t *eos, size_t n_eos,
                                  pld_tree_node *out, size_t *n_nodes);

/* pld_index_propose_tree for an outside sequence, merged into a trie the
 * caller already holds: the n-gram looked up is the suffix of
 * context[0..clen) (the caller's sequence, or its last max_n tokens), not
 * of the index's own sequence, and every candidate is inserted into
 * out[0..*n_nodes) as it is on entry -- a trie from an earlier call (on
 * another index, say) or nothing (*n_nodes = 0). On return *n_nodes is the
 * total. Candidates, in this order: for n from min(max_n, clen) down to
 * min_n, the occurrences i of context[clen-n..clen) in the index's
 * sequence with i + n < len:
 *   RECENT            the newest per_ngram of them, newest first;
 *   FIRST, FREQUENT   the earliest one only.
 * An occurrence whose continuation start i + n was taken by a candidate of
 * this call (the same text, found by a longer n) is skipped; it still
 * counts among the per_ngram of its n. A candidate is tokens[i+n ..
 * min(i+n+depth, len)), cut before its first token in eos[0..n_eos), and
 * is inserted from the root as pld_index_propose_tree inserts (a token
 * already a child is shared -- nodes that were in out on entry included,
 * and their support grows too; a new node is appended, linked after its
 * siblings, unless the trie holds max_nodes nodes). A new node's ngram is
 * the n of its candidate; nodes there on entry keep theirs.
 *
 * Requires what pld_index_propose_tree requires, context NULL only when
 * clen is 0, and *n_nodes <= max_nodes with out[0..*n_nodes) a trie as
 * these functions write it: each node's parent before it, its first child
 * and next sibling after it (checked). PLD_ERR_ARG otherwise, out and
 * *n_nodes left as they were. Any context length is fine (0: nothing to
 * look up). Ids are any int64, negative ones included. Cost: O((max_n -
 * min_n + 1) * (max_n + per_ngram * (depth + max_nodes))) at worst (FIRST:
 * max_n^2 for max_n, as its tables hold only what cannot be derived),
 * independent of the index's length. Reads the index only. */
pld_status pld_index_propose_tree_after(const pld_index *index, const int64_t *context,
                                        size_t clen, size_t depth, size_t per_ngram,
                                        size_t max_nodes, const int64_t *eos, size_t n_eos,
                                        pld_tree_node *out, size_t *n_nodes);

size_t pld_index_len(const pld_index *index);
const int64_t *pld_index_tokens(const pld_index *index); /* borrowed; valid until the next extend/truncate */
size_t pld_index_nbytes(const pld_index *index);         /* heap bytes owned */
size_t pld_index_min_n(const pld_index *index);
size_t pld_index_max_n(const pld_index *index);
pld_policy pld_index_policy(const pld_index *index);
uint64_t pld_index_key(const pld_index *index); /* as given to pld_index_new_keyed */

/* The 32-bit tag that an index with hash key `hash_key` files the n-gram
 * key_tokens[0..n) under (1 <= n <= PLD_MAX_NGRAM + 1), for tests that
 * build colliding keys. For a fixed hash_key the tag of an id in [0, 2^32)
 * is a bijection of the id. Not part of the stable API. */
uint32_t pld_index_ngram_tag(const int64_t *key_tokens, size_t n,
                             uint64_t hash_key);

/* ------------------------------------------------------------------------
 * Corpus: a bounded set of token sequences to draft from
 * ------------------------------------------------------------------------
 * Documents and earlier outputs, looked up with the suffix of a caller's
 * sequence at a cost that does not grow with the corpus.
 *
 * Storage: a FIFO of at most `segments` RECENT indexes (generations), all
 * keyed with the corpus's key (pld_index_new_keyed: ids may come from
 * untrusted text). A sequence is appended to the newest segment followed
 * by the separator -1 (never a valid id: ids are >= 0), and its start is
 * recorded so that it can be read back. A new segment starts when there is
 * none, when the newest holds >= T = ceil(max_tokens / segments) tokens,
 * or when the sequence would take the newest past max_tokens; if all
 * `segments` are in use, the oldest is dropped to make room.
 *
 * Tokens held counts the sequences' tokens; separators do not count. After
 * an add, while the tokens held exceed max_tokens, the oldest segment is
 * dropped whole (never the one just written to), and its sequences count
 * as evicted. So at most max_tokens tokens are held, in at most `segments`
 * segments.
 *
 * Memory: pld_corpus_nbytes is the sum of the segments' pld_index_nbytes,
 * 4 bytes (8 while growing) a sequence, and the corpus itself (~3 KB).
 * Per token of a segment's index (the sequence tokens plus one separator
 * a sequence), with k = max_n - min_n + 1 n-gram sizes: 8 + 8k bytes of
 * arrays (the tokens, and two 32-bit links per size) -- up to twice that
 * in the newest segment, whose arrays grow by doubling; older segments are
 * trimmed to their length when a newer one starts -- and at most 32k
 * bytes of hash tables (one per size, 8-byte slots at load >= 1/4, one
 * entry per distinct n-gram, so repetitive text takes less). With the
 * default sizes 2..4 (k = 3) that is at most 128 bytes a token in older
 * segments and 160 in the newest, plus ~20 KB fixed a segment:
 *   nbytes <= PLD_CORPUS_BYTES_PER_TOKEN * (tokens + sequences)
 *             + 24 KB * segments + 8 * sequences + 4 KB.
 * Measured on 1M tokens in sequences of 50-550 tokens, 4 segments: 60-110
 * bytes a token for text-like ids (Zipf-distributed, repeated phrases),
 * 110-130 for uniformly random ids over 49k (every n-gram new), 158 at
 * worst with one segment, just after its tables doubled.
 * tests/test_corpus.py and tests/test_corpus.c check the bound.
 *
 * No locks: one corpus must not be used by two threads at once unless the
 * caller serialises every call (the Python binding holds a lock per
 * corpus).
 */
#define PLD_CORPUS_MAX_TOKENS ((size_t)1 << 30)
#define PLD_CORPUS_MAX_SEGMENTS 64
/* Bytes a token of a segment's index at most, with min_n..max_n = 2..4
 * (see "Memory" above for the whole bound). */
#define PLD_CORPUS_BYTES_PER_TOKEN 160

typedef struct pld_corpus pld_corpus;

/* A new empty corpus; NULL unless 1 <= min_n <= max_n <= PLD_MAX_NGRAM,
 * 1 <= segments <= PLD_CORPUS_MAX_SEGMENTS and 1 <= max_tokens <=
 * PLD_CORPUS_MAX_TOKENS, or if memory runs out. Free with pld_corpus_free. */
pld_corpus *pld_corpus_new(size_t max_tokens, size_t min_n, size_t max_n, size_t segments,
                           uint64_t key);
void pld_corpus_free(pld_corpus *corpus); /* NULL is fine */

/* Add tokens[0..len) as one sequence (copied), then evict as described
 * above. PLD_ERR_ARG if len > max_tokens, a token is negative, or tokens is
 * NULL with len > 0; PLD_ERR_NOMEM if memory runs out. On any error
 * nothing changes. An empty sequence is a no-op (PLD_OK, nothing held). */
pld_status pld_corpus_add(pld_corpus *corpus, const int64_t *tokens, size_t len);

/* One trie from every segment, written to out[0..*n_nodes) (a fresh trie:
 * *n_nodes need not be 0 on entry). Candidates, in this order: for n from
 * min(max_n, m) down to min_n, where m is the number of context's last
 * tokens that are all >= 0 (an n-gram with a negative id is not looked
 * up), for each segment, newest first: its newest per_ngram occurrences of
 * context[clen-n..clen) that a token follows, newest first; an occurrence
 * whose continuation start (in its segment) a longer n took is skipped,
 * and still counts among the per_ngram. A candidate is its segment's
 * tokens[i+n .. min(i+n+depth, len)), cut before the separator and before
 * its first token in eos[0..n_eos); it is inserted as
 * pld_index_propose_tree inserts (ngram = n, support counted on every node
 * of its path; at most max_nodes nodes). Requires depth >= 1, 1 <=
 * per_ngram <= PLD_TREE_MAX_PER_NGRAM, max_nodes <= PLD_TREE_MAX_NODES, out
 * holding max_nodes nodes (NULL only when 0), context NULL only when clen
 * is 0, eos NULL only when n_eos is 0; PLD_ERR_ARG otherwise (*n_nodes =
 * 0). Cost: O(segments * (max_n - min_n + 1) * (max_n + per_ngram * (depth
 * + max_nodes))) at worst, independent of the tokens held. Reads the
 * corpus only. */
pld_status pld_corpus_propose_tree(const pld_corpus *corpus, const int64_t *context,
                                   size_t clen, size_t depth, size_t per_ngram,
                                   size_t max_nodes, const int64_t *eos, size_t n_eos,
                                   pld_tree_node *out, size_t *n_nodes);

size_t pld_corpus_tokens(const pld_corpus *corpus);    /* tokens held (no separators) */
size_t pld_corpus_sequences(const pld_corpus *corpus); /* sequences held */
uint64_t pld_corpus_evicted(const pld_corpus *corpus); /* sequences dropped so far with their
                                                        * segment (pld_corpus_clear's are not
                                                        * counted) */
size_t pld_corpus_nbytes(const pld_corpus *corpus);    /* heap bytes owned */
int64_t pld_corpus_max_id(const pld_corpus *corpus);   /* the largest id held; -1: none */
size_t pld_corpus_segments_used(const pld_corpus *corpus); /* segments in use */
size_t pld_corpus_max_tokens(const pld_corpus *corpus);
size_t pld_corpus_min_n(const pld_corpus *corpus);
size_t pld_corpus_max_n(const pld_corpus *corpus);
size_t pld_corpus_max_segments(const pld_corpus *corpus);
uint64_t pld_corpus_key(const pld_corpus *corpus);

/* The i-th sequence held, oldest first (i < pld_corpus_sequences): *tokens
 * borrowed, valid until the next add or clear; *len >= 1. PLD_ERR_ARG if i
 * is out of range (*tokens = NULL, *len = 0). */
pld_status pld_corpus_sequence(const pld_corpus *corpus, size_t i, const int64_t **tokens,
                               size_t *len);

/* Drop every sequence (not counted as evicted); the settings stay. */
void pld_corpus_clear(pld_corpus *corpus);

/* ------------------------------------------------------------------------
 * Acceptance of a verified token tree
 * ------------------------------------------------------------------------
 * A tree of n draft nodes: nodes[i] is node i's token, parents[i] its
 * parent, in [-1, i) (-1: the root, the row's last committed token), so a
 * parent comes before its children. A chain (a linear draft) has parents
 * [-1, 0, 1, ...]; n = 0 is the root alone. One forward pass verifies the
 * root and every node: position 0 is the root's, position 1 + i node i's;
 * the model's token at a position is its choice for the token after it.
 * A node's depth is its parent's + 1 (the root's is 0); the tree's depth
 * is its nodes' largest (0 for n = 0).
 *
 * The walk, shared by both functions below:
 *   node = -1
 *   repeat: t = the model's token at position node + 1; append t to out;
 *           c = the FIRST child of node with token t (the least c > node
 *           with parents[c] == node and nodes[c] == t); if none, stop;
 *           append c to path; node = c.
 * So path[0..m) (m <= n) is a chain of nodes from the root, each a child
 * of the one before, and out[0..m] (m + 1 tokens) are the path's tokens
 * and then the model's token after the path's last node: the tokens to
 * append. The token at a position of depth d is out[d]. Cost: O(n) plus
 * the positions read, whatever the tree's shape.
 *
 * path must hold n entries (NULL only when n is 0), out n + 1; *n_path
 * receives m. Token ids are any int64 (a node's token that the model never
 * chooses is never accepted). On error nothing is written to *n_path; path
 * and out may have been written to.
 */

/* Depths: depths[i] = node i's depth, for i < n, and *depth = the tree's
 * depth. PLD_ERR_ARG if a parents[i] is outside [-1, i) or a pointer is
 * NULL (parents and depths may be NULL when n is 0). */
pld_status pld_tree_depths(const int64_t *parents, size_t n, size_t *depths, size_t *depth);

/* Greedy: choices[0..n] (n + 1 ids) are the model's tokens at the n + 1
 * positions (the argmax of each). PLD_ERR_ARG if a parent is outside
 * [-1, i) or a pointer is NULL (nodes and parents may be NULL when n is
 * 0). */
pld_status pld_accept_tree_greedy(const int64_t *nodes, const int64_t *parents, size_t n,
                                  const int64_t *choices, size_t *path, int64_t *out,
                                  size_t *n_path);

typedef enum {
    PLD_F32 = 0,
    PLD_F16 = 1,  /* IEEE binary16 */
    PLD_BF16 = 2  /* bfloat16 */
} pld_float_type;

/* Sampling: probs is rows x vocab (C order, element type ftype, rows >=
 * n + 1, vocab >= 1; rows past n + 1 are ignored), row p the model's
 * distribution at position p after logits processors; rows need not be
 * normalised. The model's token at a visited position of depth d is the
 * inverse-CDF draw from its row with uniforms[d]: the least v with
 * p[v] > 0 and u * sum < p[0] + ... + p[v], the sum in double in index
 * order (if rounding leaves none, the last v with p[v] > 0). Only the
 * rows the walk visits are read.
 *
 * One uniform a depth, distinct along any path: the tokens appended are
 * i.i.d. draws from the model's distributions given the accepted prefix,
 * whatever the tree -- exact speculative sampling of a deterministic
 * draft (a draft token x is accepted with probability p(x), and the token
 * after the path is distributed as the model's).
 *
 * uniforms[0..n_uniforms) in [0, 1) (not checked), n_uniforms >= 1 + the
 * tree's depth (more are ignored). path also serves as scratch for the
 * depths. PLD_ERR_ARG on a bad parent, size, type or NULL pointer (checked
 * before any row is read); PLD_ERR_VALUE if a visited row has a NaN, a
 * negative or an infinite entry, or no positive mass. */
pld_status pld_accept_tree_sample(const int64_t *nodes, const int64_t *parents, size_t n,
                                  const void *probs, pld_float_type ftype, size_t rows,
                                  size_t vocab, const double *uniforms, size_t n_uniforms,
                                  size_t *path, int64_t *out, size_t *n_path);

#ifdef __cplusplus
}
#endif
#endif /* PLD_H */
