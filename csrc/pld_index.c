/*
 * pld_index.c -- the incremental n-gram index (see pld.h for the contract).
 *
 * Layout: the index owns the token sequence. For each n-gram size n it
 * keeps an open-addressing hash table (linear probing, load <= 1/2) whose
 * slots hold a position (the key is the n tokens found there in the
 * sequence) and a 32-bit hash tag. The tag's low bits are the slot's home,
 * so growing and deleting never re-read tokens; the tokens are compared only
 * when a tag matches.
 *
 * Per policy, the position a slot holds:
 *   FIRST     the earliest occurrence of the n-gram -- filed only when it
 *             cannot be derived from the size below (see "FIRST files
 *             lazily" further down);
 *   RECENT    the latest occurrence, with prev1[n][i] linking each
 *             occurrence to the one before it (0: none) and first1[n][i]
 *             naming the earliest (so a token tree reaches both ends of
 *             the chain in O(1));
 *   FREQUENT  the earliest occurrence, plus counts (pld_freq) used to pick
 *             the most frequent follower; sizes run to max_n + 1 so that a
 *             follower count is the count of an (n+1)-gram.
 * suffix1[n] caches, after every change, the slot position (+1) of the
 * n-gram that ends the sequence, so a FIRST or RECENT propose touches no
 * hash table at all.
 *
 * FIRST with min_n == 1 keeps the unigrams of ids in [0, PLD_UNI_DIRECT)
 * in a plain array indexed by id (uni[]) instead of tables[1]; see "Unigrams
 * by id" below.
 *
 * FIRST tables of n-grams (n >= 2) also keep a presence filter and file new
 * n-grams late (see "Filing late" below): on a stream of fresh n-grams the
 * table is far larger than the caches, and a step would otherwise wait for
 * one probe into it.
 */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* posix_memalign, madvise */
#endif
#include "pld.h"

#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif
#ifdef _MSC_VER
#include <intrin.h> /* _umul128, __umulh */
#endif

#include "pld_internal.h"
#include "pld_rules.h"

typedef struct {
    uint32_t pos1; /* start of an occurrence + 1; 0 marks an empty slot */
    uint32_t tag;  /* high 32 bits of the n-gram's hash; low bits = home */
} pld_slot;

typedef struct {
    uint32_t count;      /* occurrences of this n-gram */
    uint32_t best_pos1;  /* start + 1 of an occurrence followed by the best follower */
    uint32_t best_count; /* how often the best follower follows; 0: none yet */
} pld_freq;

/* New n-grams that wait to be filed (at most this many per table). */
#define PLD_PENDING 8

typedef struct {
    pld_slot *slots;  /* capacity slots, capacity a power of two (or 0) */
    pld_freq *freq;   /* FREQUENT only: capacity entries, parallel to slots */
    size_t mask;      /* capacity - 1 */
    size_t used;      /* occupied slots plus pending entries */
    /* Filtered tables only (FIRST, n >= 2): */
    int filtered;
    uint64_t *seen;   /* presence filter: word w for the homes [16w, 16w + 16) */
    pld_slot pending[PLD_PENDING]; /* new n-grams not yet in slots, a ring */
    size_t n_pending, pending_head; /* pending_head: the oldest */
} pld_table;

/* FIRST, min_n == 1: the unigram of an id in [0, PLD_UNI_DIRECT). */
typedef struct {
    uint32_t pos1; /* earliest occurrence + 1; 0: the id does not occur */
    uint32_t pred; /* the token before that occurrence if it is in
                    * [0, PLD_PRED_NONE), else PLD_PRED_NONE (read the sequence) */
} pld_uni;

typedef struct {
    uint64_t seed;   /* the n-gram state before the first token */
    uint32_t uni[2]; /* the key words of the unigram mix */
} pld_hash_key; /* derived from the key: see "hashing" */

#define PLD_UNI_DIRECT ((int64_t)1 << 20)
#define PLD_PRED_NONE UINT32_MAX

struct pld_index {
    int64_t *tokens;      /* the sequence: cap entries, len used */
    size_t len, cap;
    size_t min_n, max_n;  /* n-gram sizes that drafts are looked up with */
    size_t hi;            /* largest table size: max_n (+1 for FREQUENT) */
    pld_policy policy;
    uint64_t key;         /* the hash key (pld_index_new_keyed) */
    pld_hash_key hk;      /* derived from it: every tag uses these */
    pld_table tables[PLD_MAX_NGRAM + 2];  /* tables[n] for n in [min_n, hi] */
    uint32_t *prev1[PLD_MAX_NGRAM + 1];   /* RECENT: cap entries per n */
    uint32_t *first1[PLD_MAX_NGRAM + 1];  /* RECENT: the earliest occurrence (+1) of
                                           * the n-gram at each position */
    uint32_t suffix1[PLD_MAX_NGRAM + 2];  /* slot position of the suffix n-gram */
    int wide_unigrams;    /* a token outside [0, 2^32) was ever pushed */
    int uni_direct;       /* uni[] is in use (FIRST with min_n == 1, from
                           * when it became no larger than the sequence) */
    size_t uni_check_at;  /* the length at which to see if it is; SIZE_MAX: never */
    pld_uni *uni;         /* uni_cap entries (a power of two, or 0) */
    size_t uni_cap;
};

#define PLD_TABLE_MIN_CAPACITY 16u

#if defined(__GNUC__) || defined(__clang__)
#define PLD_PREFETCH(p) __builtin_prefetch(p)
#else
#define PLD_PREFETCH(p) ((void)(p))
#endif

/* ---------------------------------------------------------------- hashing
 *
 * An n-gram's tag mixes its tokens from the newest back to the oldest, so
 * push_token gets the tags of every size that ends at the new token in one
 * pass. A unigram in [0, 2^32) -- a token id of any real vocabulary -- gets
 * a bijective 32-bit mix instead: among such unigrams equal tags mean equal
 * tokens, so a unigram probe need not read the sequence (see tag_is_key).
 *
 * Every tag is keyed by the index's 64-bit key (pld_index_new_keyed), so
 * ids crafted to share their homes under one key -- flooding one probe run
 * and making extend quadratic -- spread under another:
 *   - n-grams: the state starts from a key-derived value, and each step is
 *     a folded multiply (the xor of both halves of the 128-bit product of
 *     state ^ token and a constant). A plain 64-bit multiply would not do:
 *     it passes a difference in the top bit unchanged whatever the state,
 *     so n-grams whose tokens differ in a few fixed bits would reach equal
 *     states under every key; the high half's carries depend on the state;
 *   - unigrams in [0, 2^32): two key words are xored in, one before and
 *     one between the two rounds of the 32-bit mix (still a bijection).
 * Key 0 gives PLD_HASH_SEED and the plain 32-bit mix (key words 0). */

#define PLD_HASH_SEED 0x9E3779B97F4A7C15ull
#define PLD_HASH_MUL 0xff51afd7ed558ccdull

/* A bijection of the 64-bit integers with 0 -> 0 (murmur3's fmix64), so
 * key 0 derives all-zero words. */
static uint64_t fmix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static pld_hash_key hash_key_make(uint64_t key)
{
    pld_hash_key hk;
    const uint64_t a = fmix64(key), b = fmix64(a);
    hk.seed = PLD_HASH_SEED ^ a;
    hk.uni[0] = (uint32_t)b;
    hk.uni[1] = (uint32_t)(b >> 32);
    return hk;
}

/* The low and high 64 bits of a * b, xored. */
static inline uint64_t folded_mul(uint64_t a, uint64_t b)
{
#if defined(__SIZEOF_INT128__) && !defined(PLD_PORTABLE_MUL)
    __extension__ typedef unsigned __int128 pld_u128;
    const pld_u128 p = (pld_u128)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
#elif defined(_MSC_VER) && defined(_M_X64) && !defined(PLD_PORTABLE_MUL)
    uint64_t hi;
    const uint64_t lo = _umul128(a, b, &hi);
    return lo ^ hi;
#elif defined(_MSC_VER) && defined(_M_ARM64) && !defined(PLD_PORTABLE_MUL)
    return (a * b) ^ __umulh(a, b);
#else
    const uint64_t a0 = a & 0xffffffffu, a1 = a >> 32;
    const uint64_t b0 = b & 0xffffffffu, b1 = b >> 32;
    const uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    const uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
    const uint64_t hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
    return (a * b) ^ hi;
#endif
}

static inline uint64_t hash_step(uint64_t h, int64_t token)
{
    return folded_mul(h ^ (uint64_t)token, PLD_HASH_MUL);
}

static inline uint32_t hash_final(uint64_t h)
{
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    return (uint32_t)(h >> 32);
}

static inline int unigram_in_range(int64_t token)
{
    return token >= 0 && token <= (int64_t)UINT32_MAX;
}

/* A bijection of the 32-bit integers whose low bits spread well, for any
 * key words. */
static inline uint32_t unigram_tag(const pld_hash_key *hk, uint32_t x)
{
    x ^= hk->uni[0];
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x ^= hk->uni[1];
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static inline uint32_t hash_tag(const pld_hash_key *hk, const int64_t *key, size_t n)
{
    uint64_t h = hk->seed;
    size_t i = n;
    if (n == 1 && unigram_in_range(key[0]))
        return unigram_tag(hk, (uint32_t)key[0]);
    while (i-- > 0)
        h = hash_step(h, key[i]);
    return hash_final(h);
}

/* ----------------------------------------------------------------- tables */

/* Do the n tokens at a and b match? n is small (<= PLD_MAX_NGRAM + 1): a
 * plain loop beats a call to memcmp. */
static inline int keys_equal(const int64_t *a, const int64_t *b, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

/* The slot holding key (n tokens), or the empty slot where it would go.
 * tag_is_key: a matching tag is the key (no need to read the tokens). */
static inline size_t table_probe(const pld_table *t, const int64_t *tokens,
                                 const int64_t *key, size_t n, uint32_t tag,
                                 int tag_is_key, int *found)
{
    size_t i = tag & t->mask;
    for (;;) {
        const pld_slot s = t->slots[i];
        if (s.pos1 == 0) {
            *found = 0;
            return i;
        }
        if (s.tag == tag &&
            (tag_is_key || keys_equal(tokens + (s.pos1 - 1), key, n))) {
            *found = 1;
            return i;
        }
        i = (i + 1) & t->mask;
    }
}

/* Does a matching tag in tables[n] prove the key? For a unigram in
 * [0, 2^32) it does while every unigram in the table is in that range:
 * their tags are a bijection of their tokens. */
static inline int tag_is_key(const pld_index *ix, const int64_t *key, size_t n)
{
    return n == 1 && !ix->wide_unigrams && unigram_in_range(key[0]);
}

/* table_probe on tables[n] of the index. */
static inline size_t index_probe(const pld_index *ix, size_t n, const int64_t *key,
                                 uint32_t tag, int *found)
{
    return table_probe(&ix->tables[n], ix->tokens, key, n, tag,
                       tag_is_key(ix, key, n), found);
}

/* memset called through a volatile pointer: a compiler may fold malloc +
 * memset(0) into calloc (GCC does at -O2), which is what pld_alloc_written
 * must not be. */
static void *(*const volatile write_bytes)(void *, int, size_t) = memset;

void *pld_alloc_written(size_t count, size_t size)
{
    void *p = NULL;
    size_t bytes;
    if (size != 0 && count > SIZE_MAX / size)
        return NULL;
    bytes = count * size;
#ifdef __linux__
    {
        const size_t huge = (size_t)2 << 20;
        if (bytes >= huge) {
            if (posix_memalign(&p, huge, bytes) != 0)
                return NULL;
            (void)madvise(p, bytes, MADV_HUGEPAGE); /* a hint: failure is fine */
            write_bytes(p, 0, bytes);
            return p;
        }
    }
#endif
    p = malloc(bytes ? bytes : 1);
    if (p != NULL)
        write_bytes(p, 0, bytes);
    return p;
}

/* ------------------------------------------------------------ filing late
 *
 * A FIRST table of n-grams (n >= 2) keeps a presence filter: one 64-bit
 * word for every 16 home slots, in which an n-gram sets two bits picked by
 * its tag (at least 8 bits an entry at load <= 1/2: about 5% false
 * positives when full). Every filed or pending n-gram has its bits set, so
 * a clear bit proves the n-gram is not in the table, and the filter, a
 * sixteenth of the table's size, mostly answers from the cache. A word
 * depends only on the entries whose home it covers: table_delete
 * recomputes it from them (seen_refresh), and a resize rebuilds them all.
 *
 * An n-gram the filter proves new is not probed for: it joins a ring of at
 * most PLD_PENDING pending entries, its home slot is prefetched, and it is
 * filed when the ring is full -- by then the slot has arrived, so filing
 * does not wait for memory. A lookup that the filter lets through checks
 * the ring as well as the table. Pending entries are counted in `used`;
 * a resize files them, and truncation files them before it undoes
 * anything, so only these few paths know of the ring. */

/* Home slots per filter word; a table has at least PLD_TABLE_MIN_CAPACITY
 * (16) slots, so at least one word. */
#ifndef PLD_SEEN_SHIFT
#define PLD_SEEN_SHIFT 4
#endif
#define PLD_SEEN_HOMES ((size_t)1 << PLD_SEEN_SHIFT)

/* Filter words of a table of `capacity` slots. */
static inline size_t seen_words(size_t capacity)
{
    return capacity / PLD_SEEN_HOMES;
}

static inline size_t seen_word(const pld_table *t, uint32_t tag)
{
    return (tag & t->mask) >> PLD_SEEN_SHIFT;
}

/* Two bits from a remix of the tag (the word took its low bits). */
static inline uint64_t seen_bits(uint32_t tag)
{
    const uint32_t m = tag * 0x9E3779B1u;
    return (1ull << (m >> 26)) | (1ull << ((m >> 20) & 63u));
}

static inline int seen_maybe(const pld_table *t, uint32_t tag)
{
    const uint64_t b = seen_bits(tag);
    return (t->seen[seen_word(t, tag)] & b) == b;
}

static inline void seen_add(pld_table *t, uint32_t tag)
{
    t->seen[seen_word(t, tag)] |= seen_bits(tag);
}

/* Recompute the filter word of `tag` from the entries whose home it covers
 * (after a deletion). Such an entry sits at or after its home with every
 * slot between them taken, so a scan from the word's first home that stops
 * at the first free slot past its last home meets them all. */
static void seen_refresh(pld_table *t, uint32_t tag)
{
    const size_t w = seen_word(t, tag);
    size_t i = w << PLD_SEEN_SHIFT, steps = 0;
    uint64_t bits = 0;
    for (;; i = (i + 1) & t->mask, steps++) {
        const pld_slot s = t->slots[i];
        if (s.pos1 == 0) {
            if (steps >= PLD_SEEN_HOMES)
                break;
            continue;
        }
        if (seen_word(t, s.tag) == w)
            bits |= seen_bits(s.tag);
    }
    t->seen[w] = bits;
}

/* Put an entry whose key is in no slot into the first free slot of its run. */
static inline size_t table_place(pld_table *t, pld_slot entry)
{
    size_t i = entry.tag & t->mask;
    while (t->slots[i].pos1 != 0)
        i = (i + 1) & t->mask;
    t->slots[i] = entry;
    return i;
}

/* File the oldest pending entry. */
static inline void file_oldest(pld_table *t)
{
    (void)table_place(t, t->pending[t->pending_head]);
    t->pending_head = (t->pending_head + 1) % PLD_PENDING;
    t->n_pending--;
}

static void file_pending(pld_table *t)
{
    while (t->n_pending > 0)
        file_oldest(t);
    t->pending_head = 0;
}

/* Queue a new n-gram (the filter proved it absent, so it is in neither the
 * slots nor the ring); room for it is reserved. */
static inline void queue_new(pld_table *t, uint32_t pos1, uint32_t tag)
{
    pld_slot e;
    if (t->n_pending == PLD_PENDING)
        file_oldest(t);
    e.pos1 = pos1;
    e.tag = tag;
    t->pending[(t->pending_head + t->n_pending) % PLD_PENDING] = e;
    t->n_pending++;
    t->used++;
    seen_add(t, tag); /* push_begin prefetched the home slot */
}

/* The pending entry holding key (n tokens), as its pos1; 0 if none. */
static inline uint32_t pending_find(const pld_table *t, const int64_t *tokens,
                                    const int64_t *key, size_t n, uint32_t tag)
{
    size_t i;
    for (i = 0; i < t->n_pending; i++) {
        const pld_slot e = t->pending[(t->pending_head + i) % PLD_PENDING];
        if (e.tag == tag && keys_equal(tokens + (e.pos1 - 1), key, n))
            return e.pos1;
    }
    return 0;
}

static pld_status table_resize(pld_table *t, size_t capacity, int with_freq)
{
    pld_slot *slots = pld_alloc_written(capacity, sizeof(pld_slot));
    pld_freq *freq = NULL;
    uint64_t *seen = NULL;
    size_t old_cap = t->slots ? t->mask + 1 : 0, i;
    if (slots == NULL)
        return PLD_ERR_NOMEM;
    if (with_freq) {
        freq = pld_alloc_written(capacity, sizeof(pld_freq));
        if (freq == NULL) {
            free(slots);
            return PLD_ERR_NOMEM;
        }
    }
    if (t->filtered) {
        seen = pld_alloc_written(seen_words(capacity), sizeof(uint64_t));
        if (seen == NULL) {
            free(slots);
            return PLD_ERR_NOMEM;
        }
    }
    file_pending(t); /* room for them is counted in used: old_cap > 0 here */
    for (i = 0; i < old_cap; i++) {
        size_t j;
        if (t->slots[i].pos1 == 0)
            continue;
        j = t->slots[i].tag & (capacity - 1);
        while (slots[j].pos1 != 0)
            j = (j + 1) & (capacity - 1);
        slots[j] = t->slots[i];
        if (with_freq)
            freq[j] = t->freq[i];
    }
    free(t->slots);
    free(t->freq);
    free(t->seen);
    t->slots = slots;
    t->freq = freq;
    t->seen = seen;
    t->mask = capacity - 1;
    if (seen != NULL) {
        for (i = 0; i < capacity; i++)
            if (slots[i].pos1 != 0)
                seen_add(t, slots[i].tag);
    }
    return PLD_OK;
}

/* Room for one more entry at load <= 1/2 (a higher load saves memory but
 * lengthens the probe runs of new n-grams: measured slower at 1M tokens). */
static pld_status table_reserve_one(pld_table *t, int with_freq)
{
    size_t cap = t->slots ? t->mask + 1 : 0;
    if ((t->used + 1) * 2 <= cap)
        return PLD_OK;
    if (cap > SIZE_MAX / 2 / sizeof(pld_freq))
        return PLD_ERR_OVERFLOW;
    return table_resize(t, cap ? cap * 2 : PLD_TABLE_MIN_CAPACITY, with_freq);
}

/* Backward-shift deletion keeps probe chains intact without tombstones
 * (entries move, their homes do not); a filtered table recomputes the
 * filter word of the deleted entry's home. */
static void table_delete(pld_table *t, size_t i)
{
    const uint32_t tag = t->slots[i].tag;
    size_t j = i;
    for (;;) {
        size_t home;
        j = (j + 1) & t->mask;
        if (t->slots[j].pos1 == 0)
            break;
        home = t->slots[j].tag & t->mask;
        if (((j - home) & t->mask) >= ((j - i) & t->mask)) {
            t->slots[i] = t->slots[j];
            if (t->freq)
                t->freq[i] = t->freq[j];
            i = j;
        }
    }
    t->slots[i].pos1 = 0;
    t->slots[i].tag = 0;
    if (t->freq)
        memset(&t->freq[i], 0, sizeof(pld_freq));
    t->used--;
    if (t->seen != NULL)
        seen_refresh(t, tag);
}

static void table_clear(pld_table *t)
{
    if (t->slots == NULL)
        return;
    memset(t->slots, 0, (t->mask + 1) * sizeof(pld_slot));
    if (t->freq)
        memset(t->freq, 0, (t->mask + 1) * sizeof(pld_freq));
    if (t->seen)
        memset(t->seen, 0, seen_words(t->mask + 1) * sizeof(uint64_t));
    t->n_pending = t->pending_head = 0;
    t->used = 0;
}

/* ---------------------------------------------------------- unigrams by id
 *
 * An id's unigram is where the id first occurs. Under FIRST with min_n == 1
 * a step looks it up for every new token, and drafts on fresh text come
 * from it: for ids in [0, PLD_UNI_DIRECT) -- the ids of any vocabulary --
 * a plain array indexed by id answers with one load, and it is 4x smaller
 * than a hash table of the same unigrams (8 bytes an id, no empty slots),
 * so it stays in the cache. Each entry also holds the token before the
 * earliest occurrence, so the derivation of the bigram ending at the new
 * token (see "FIRST files lazily") need not read the sequence there. Other
 * ids go to tables[1] as before.
 *
 * The array takes 8 bytes for every id up to the largest one seen, which
 * in a short sequence of a large vocabulary is far more than the hash
 * table: the unigrams move to it (uni_adopt) only once it is no larger
 * than the sequence, checked as the length doubles. */

/* Can the array hold this id's unigram? */
static inline int uni_in_range(int64_t token)
{
    return token >= 0 && token < PLD_UNI_DIRECT;
}

static inline int uni_is_direct(const pld_index *ix, int64_t token)
{
    return ix->uni_direct && uni_in_range(token);
}

/* Entries the array needs to reach id `top` (grown from `from`): a power of
 * two, at least 1024. */
static inline size_t uni_cap_for(size_t from, size_t top)
{
    size_t cap = from ? from : 1024;
    while (cap <= top)
        cap *= 2;
    return cap;
}

/* The id's entry, or NULL when the array does not reach it (no occurrence). */
static inline pld_uni *uni_entry(const pld_index *ix, int64_t token)
{
    return (size_t)token < ix->uni_cap ? &ix->uni[token] : NULL;
}

/* Room in uni[] for a direct id. All or nothing. */
static pld_status uni_reserve(pld_index *ix, int64_t token)
{
    size_t cap;
    pld_uni *uni;
    if ((size_t)token < ix->uni_cap)
        return PLD_OK;
    cap = uni_cap_for(ix->uni_cap, (size_t)token);
    uni = realloc(ix->uni, cap * sizeof(pld_uni));
    if (uni == NULL)
        return PLD_ERR_NOMEM;
    memset(uni + ix->uni_cap, 0, (cap - ix->uni_cap) * sizeof(pld_uni));
    ix->uni = uni;
    ix->uni_cap = cap;
    return PLD_OK;
}

static inline uint32_t pred_code(int64_t token)
{
    return token >= 0 && token < (int64_t)PLD_PRED_NONE ? (uint32_t)token : PLD_PRED_NONE;
}

/* If the array would be no larger than the sequence (in entries), move the
 * unigrams of ids in [0, PLD_UNI_DIRECT) from tables[1] to it; else look
 * again when the length has doubled. The sequence and its answers do not
 * change; if memory is short the unigrams simply stay where they are. */
static void uni_adopt(pld_index *ix)
{
    pld_table *t = &ix->tables[1];
    const size_t cap = t->slots ? t->mask + 1 : 0;
    int64_t top = -1;
    size_t i, n_other = 0;
    pld_slot *other; /* the entries of ids the array does not take */
    for (i = 0; i < cap; i++) {
        const uint32_t p1 = t->slots[i].pos1;
        if (p1 != 0 && uni_in_range(ix->tokens[p1 - 1]) && ix->tokens[p1 - 1] > top)
            top = ix->tokens[p1 - 1];
    }
    other = malloc((cap ? cap : 1) * sizeof(pld_slot));
    if (uni_cap_for(0, top < 0 ? 0 : (size_t)top) > ix->len || other == NULL ||
        (top >= 0 && uni_reserve(ix, top) != PLD_OK)) {
        free(other); /* look again when the length has doubled */
        ix->uni_check_at = ix->len <= SIZE_MAX / 2 ? 2 * ix->len : SIZE_MAX;
        return;
    }
    for (i = 0; i < cap; i++) {
        const pld_slot e = t->slots[i];
        int64_t token;
        if (e.pos1 == 0)
            continue;
        token = ix->tokens[e.pos1 - 1];
        if (!uni_in_range(token)) {
            other[n_other++] = e;
            continue;
        }
        ix->uni[token].pos1 = e.pos1;
        ix->uni[token].pred = e.pos1 >= 2 ? pred_code(ix->tokens[e.pos1 - 2]) : PLD_PRED_NONE;
    }
    /* tables[1] keeps the other ids: refile them (their tags are kept) */
    table_clear(t);
    for (i = 0; i < n_other; i++)
        (void)table_place(t, other[i]);
    t->used = n_other;
    free(other);
    ix->uni_direct = 1;
    ix->uni_check_at = SIZE_MAX;
}

/* ------------------------------------------------------------- life cycle */

pld_index *pld_index_new(size_t min_n, size_t max_n, pld_policy policy)
{
    return pld_index_new_keyed(min_n, max_n, policy, 0);
}

pld_index *pld_index_new_keyed(size_t min_n, size_t max_n, pld_policy policy,
                               uint64_t key)
{
    pld_index *ix;
    size_t n;
    if (min_n < 1 || min_n > max_n || max_n > PLD_MAX_NGRAM)
        return NULL;
    if (policy != PLD_POLICY_FIRST && policy != PLD_POLICY_RECENT &&
        policy != PLD_POLICY_FREQUENT)
        return NULL;
    ix = calloc(1, sizeof(*ix));
    if (ix == NULL)
        return NULL;
    ix->min_n = min_n;
    ix->max_n = max_n;
    ix->hi = policy == PLD_POLICY_FREQUENT ? max_n + 1 : max_n;
    ix->policy = policy;
    ix->key = key;
    ix->hk = hash_key_make(key);
    if (policy == PLD_POLICY_FIRST)
        for (n = min_n > 2 ? min_n : 2; n <= max_n; n++)
            ix->tables[n].filtered = 1;
    ix->uni_check_at = policy == PLD_POLICY_FIRST && min_n == 1 ? 1024 : SIZE_MAX;
    return ix;
}

void pld_index_free(pld_index *ix)
{
    size_t n;
    if (ix == NULL)
        return;
    for (n = 0; n < PLD_MAX_NGRAM + 2; n++) {
        free(ix->tables[n].slots);
        free(ix->tables[n].freq);
        free(ix->tables[n].seen);
    }
    for (n = 0; n < PLD_MAX_NGRAM + 1; n++) {
        free(ix->prev1[n]);
        free(ix->first1[n]);
    }
    free(ix->tokens);
    free(ix->uni);
    free(ix);
}

/* Room for `extra` more tokens. */
static pld_status reserve_tokens(pld_index *ix, size_t extra)
{
    size_t need, cap, n;
    if (extra > PLD_INDEX_MAX_TOKENS - ix->len)
        return PLD_ERR_OVERFLOW;
    need = ix->len + extra;
    if (need <= ix->cap)
        return PLD_OK;
    cap = ix->cap ? ix->cap : 256;
    while (cap < need)
        cap = cap > PLD_INDEX_MAX_TOKENS / 2 ? PLD_INDEX_MAX_TOKENS : cap * 2;
    {
        int64_t *tokens = realloc(ix->tokens, cap * sizeof(int64_t));
        if (tokens == NULL)
            return PLD_ERR_NOMEM;
        ix->tokens = tokens;
    }
    if (ix->policy == PLD_POLICY_RECENT) {
        for (n = ix->min_n; n <= ix->max_n; n++) {
            uint32_t *prev = realloc(ix->prev1[n], cap * sizeof(uint32_t)), *first;
            if (prev == NULL)
                return PLD_ERR_NOMEM; /* cap stays: the grown ones are fine */
            ix->prev1[n] = prev;
            first = realloc(ix->first1[n], cap * sizeof(uint32_t));
            if (first == NULL)
                return PLD_ERR_NOMEM;
            ix->first1[n] = first;
        }
    }
    ix->cap = cap;
    return PLD_OK;
}

/* Grow every table to hold `extra` more entries at load <= 1/2, and the
 * sequence to hold `extra` more tokens: one token adds at most one entry to
 * each table. */
pld_status pld_index_reserve(pld_index *ix, size_t extra)
{
    const int with_freq = ix != NULL && ix->policy == PLD_POLICY_FREQUENT;
    size_t n;
    pld_status st;
    if (ix == NULL)
        return PLD_ERR_ARG;
    st = reserve_tokens(ix, extra);
    if (st != PLD_OK)
        return st;
    for (n = ix->min_n; n <= ix->hi; n++) {
        pld_table *t = &ix->tables[n];
        const size_t cap = t->slots ? t->mask + 1 : 0;
        size_t need, grown = cap ? cap : PLD_TABLE_MIN_CAPACITY;
        if (extra > SIZE_MAX / 4 / sizeof(pld_freq) - t->used)
            return PLD_ERR_OVERFLOW;
        need = (t->used + extra) * 2;
        if (need <= cap)
            continue;
        while (grown < need)
            grown *= 2;
        st = table_resize(t, grown, with_freq);
        if (st != PLD_OK)
            return st;
    }
    return PLD_OK;
}

/* ------------------------------------------------------------------ extend */

#if defined(__GNUC__) || defined(__clang__)
#define PLD_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define PLD_ALWAYS_INLINE inline
#endif

/* The first half of appending a token, shared by every policy: room in
 * tables[lo..top] (all or nothing), the token written at ix->len (len
 * itself is not advanced), and tags[n] for n in [lo, top] -- computed in
 * one pass, as hash_tag computes them -- with a prefetch of each home slot
 * (and, in a filtered table, of the filter's word: the slot is needed
 * either way, now or when the n-gram is filed), so that the misses of
 * large tables overlap instead of queueing. */
static PLD_ALWAYS_INLINE pld_status push_begin(pld_index *ix, int64_t token, const int with_freq,
                                               const size_t lo, const size_t top,
                                               uint32_t *tags)
{
    const size_t len1 = ix->len + 1;
    uint64_t h = ix->hk.seed;
    size_t n;
    for (n = lo; n <= top; n++) {
        pld_status st = table_reserve_one(&ix->tables[n], with_freq);
        if (st != PLD_OK)
            return st;
    }
    ix->tokens[ix->len] = token;
    if (!unigram_in_range(token))
        ix->wide_unigrams = 1;
    for (n = 1; n <= top; n++) {
        h = hash_step(h, ix->tokens[len1 - n]);
        if (n >= lo) {
            const pld_table *t = &ix->tables[n];
            tags[n] = n == 1 && unigram_in_range(token) ? unigram_tag(&ix->hk, (uint32_t)token)
                                                         : hash_final(h);
            if (t->seen != NULL)
                PLD_PREFETCH(&t->seen[seen_word(t, tags[n])]);
            PLD_PREFETCH(&t->slots[tags[n] & t->mask]);
        }
    }
    return PLD_OK;
}

/* The slot of key (n tokens, tag) in tables[n]; if it is not in a slot, it
 * is filed now at pos1 (room for it is reserved; in a filtered table the
 * caller has checked the pending ring). *found: it was in a slot. */
static inline size_t find_or_file(pld_index *ix, size_t n, const int64_t *key, uint32_t tag,
                                  size_t pos1, int *found)
{
    pld_table *t = &ix->tables[n];
    const size_t s = index_probe(ix, n, key, tag, found);
    if (!*found) {
        t->slots[s].pos1 = (uint32_t)pos1;
        t->slots[s].tag = tag;
        t->used++;
        if (t->seen != NULL)
            seen_add(t, tag);
    }
    return s;
}

/* The lines of a draft that a propose would copy from tokens[pos] (pos <=
 * len <= cap): a draft of the usual 10 tokens (80 bytes) spans at most two. */
static inline void prefetch_draft(const pld_index *ix, size_t pos)
{
    PLD_PREFETCH(ix->tokens + pos);
    if (pos + 9 < ix->cap)
        PLD_PREFETCH(ix->tokens + pos + 9);
}

/* FIRST files lazily. Let g be an n-gram (n > min_n) and g' its last n-1
 * tokens, whose earliest occurrence starts at p'. Every occurrence s of g
 * holds g' at s + 1 >= p', so:
 *   - if g occurs at p' - 1 (tokens[p' - 1] == g[0]), that is g's earliest
 *     occurrence: it is derived from the size below, never filed;
 *   - otherwise each occurrence of g has s + 1 > p', that is, g' was
 *     already known when g arrived: tables[n] holds the earliest of them.
 * So an n-gram is filed only when its last n-1 tokens are a repeat and the
 * derivation fails. On a stream of fresh n-grams (random ids), no trigram
 * is filed at all, so a step probes one large table instead of two, and
 * real text files far fewer trigrams (the index is smaller, and more of it
 * stays in cache).
 *
 * The earliest occurrence (start + 1) of the n-gram at `start` that ends
 * the sequence, given first1 = that of its last n-1 tokens (at start + 1)
 * and pred = the token before that occurrence when known (pld_uni.pred),
 * else PLD_PRED_NONE; *probe is set when the answer needs tables[n]. */
static inline uint32_t first_by_derivation(const pld_index *ix, size_t start,
                                           uint32_t first1, uint32_t pred, int *probe)
{
    *probe = 0;
    if (first1 == start + 2)  /* g' is new here, so g is new here */
        return (uint32_t)(start + 1);
    if (first1 >= 2) {
        const int64_t before = pred != PLD_PRED_NONE ? (int64_t)pred : ix->tokens[first1 - 2];
        if (before == ix->tokens[start])
            return first1 - 1;    /* g occurs at p' - 1 */
    }
    *probe = 1;
    return 0;
}

/* Append one token under FIRST; space for it is reserved. All or nothing.
 * `min_n` and `top` (= min(max_n, len + 1)) are passed in so that constant
 * values give the default sizes their own unrolled copy. */
static PLD_ALWAYS_INLINE pld_status push_token_first(pld_index *ix, int64_t token,
                                                     const size_t min_n, const size_t top)
{
    const size_t len1 = ix->len + 1;
    int direct;
    size_t lo, n;
    uint32_t tags[PLD_MAX_NGRAM + 2], pred = PLD_PRED_NONE;
    pld_status st;
    if (ix->len >= ix->uni_check_at)
        uni_adopt(ix);
    direct = min_n == 1 && uni_is_direct(ix, token);
    lo = direct ? 2 : min_n; /* the sizes that use tables */
    st = direct ? uni_reserve(ix, token) : PLD_OK;
    if (st != PLD_OK)
        return st;
    st = push_begin(ix, token, 0, lo, top, tags);
    if (st != PLD_OK)
        return st;
    if (direct) {
        pld_uni *u = &ix->uni[token];
        if (u->pos1 == 0) {
            u->pos1 = (uint32_t)len1;
            u->pred = len1 >= 2 ? pred_code(ix->tokens[len1 - 2]) : PLD_PRED_NONE;
        }
        ix->suffix1[1] = u->pos1;
        pred = u->pred;
        prefetch_draft(ix, u->pos1); /* see below */
    }
    for (n = lo; n <= top; n++) {
        pld_table *t = &ix->tables[n];
        const size_t start = len1 - n;
        uint32_t first = 0;
        int probe = 1;
        if (n > min_n)
            first = first_by_derivation(ix, start, ix->suffix1[n - 1],
                                        n == 2 ? pred : PLD_PRED_NONE, &probe);
        if (probe && t->seen != NULL && !seen_maybe(t, tags[n])) {
            first = (uint32_t)(start + 1); /* new: filed later */
            queue_new(t, first, tags[n]);
        } else if (probe) {
            const int64_t *key = ix->tokens + start;
            first = t->seen != NULL ? pending_find(t, ix->tokens, key, n, tags[n]) : 0;
            if (first == 0) {
                int found;
                first = t->slots[find_or_file(ix, n, key, tags[n], start + 1, &found)].pos1;
            }
        }
        ix->suffix1[n] = first;
        /* The next propose copies from here. Asked for now, the lines
         * arrive while the larger tables' probes still wait. */
        prefetch_draft(ix, first - 1 + n);
    }
    ix->len = len1;
    return PLD_OK;
}

/* Append one token under RECENT or FREQUENT (which file every n-gram);
 * space for it is reserved. All or nothing. `policy`, `min_n` and `top`
 * are ix->policy, ix->min_n and min(ix->hi, len + 1),
 * passed in so that constant values give each caller its own unrolled copy. */
static PLD_ALWAYS_INLINE pld_status push_token_as(pld_index *ix, int64_t token,
                                                  const pld_policy policy,
                                                  const size_t min_n, const size_t top)
{
    const size_t len1 = ix->len + 1;
    const int with_freq = policy == PLD_POLICY_FREQUENT;
    uint32_t tags[PLD_MAX_NGRAM + 2];
    size_t n;
    pld_status st = push_begin(ix, token, with_freq, min_n, top, tags);
    if (st != PLD_OK)
        return st;
    for (n = min_n; n <= top; n++) {
        pld_table *t = &ix->tables[n];
        const size_t start = len1 - n;
        const int64_t *key = ix->tokens + start;
        int found;
        size_t s = find_or_file(ix, n, key, tags[n], start + 1, &found);
        if (policy == PLD_POLICY_RECENT) {
            ix->prev1[n][start] = found ? t->slots[s].pos1 : 0;
            ix->first1[n][start] = found ? ix->first1[n][t->slots[s].pos1 - 1]
                                         : (uint32_t)(start + 1);
            t->slots[s].pos1 = (uint32_t)(start + 1);
            ix->suffix1[n] = (uint32_t)(start + 1);
        } else {
            const uint32_t count = ++t->freq[s].count;
            ix->suffix1[n] = t->slots[s].pos1;
            if (n > min_n) {
                /* This n-gram is the (n-1)-gram at `start` plus a follower. */
                pld_table *p = &ix->tables[n - 1];
                int pf;
                size_t ps = index_probe(ix, n - 1, key, hash_tag(&ix->hk, key, n - 1), &pf);
                if (count > p->freq[ps].best_count) {
                    p->freq[ps].best_count = count;
                    p->freq[ps].best_pos1 = (uint32_t)(start + 1);
                }
            }
        }
    }
    ix->len = len1;
    return PLD_OK;
}

static pld_status push_token(pld_index *ix, int64_t token)
{
    const size_t len1 = ix->len + 1;
    const size_t top = ix->hi < len1 ? ix->hi : len1;
    switch (ix->policy) {
    case PLD_POLICY_RECENT:
        return push_token_as(ix, token, PLD_POLICY_RECENT, ix->min_n, top);
    case PLD_POLICY_FREQUENT:
        return push_token_as(ix, token, PLD_POLICY_FREQUENT, ix->min_n, top);
    default:
        /* The default sizes (1..3) with constant bounds, so the loops unroll. */
        if (ix->min_n == 1 && top == 3)
            return push_token_first(ix, token, 1, 3);
        return push_token_first(ix, token, ix->min_n, top);
    }
}

#define PLD_DEFINE_EXTEND(NAME, T)                                             \
    pld_status NAME(pld_index *ix, const T *tokens, size_t count)              \
    {                                                                          \
        size_t i;                                                              \
        pld_status st;                                                         \
        if (ix == NULL || (tokens == NULL && count > 0))                       \
            return PLD_ERR_ARG;                                                \
        st = reserve_tokens(ix, count);                                        \
        if (st != PLD_OK)                                                      \
            return st;                                                         \
        for (i = 0; i < count; i++) {                                          \
            st = push_token(ix, (int64_t)tokens[i]);                           \
            if (st != PLD_OK)                                                  \
                return st;                                                     \
        }                                                                      \
        return PLD_OK;                                                         \
    }

PLD_DEFINE_EXTEND(pld_index_extend, int64_t)
PLD_DEFINE_EXTEND(pld_index_extend_i32, int32_t)

/* ---------------------------------------------------------------- truncate */

/* After len changed: refresh the cached suffix positions. */
static void refresh_suffix(pld_index *ix)
{
    size_t n;
    for (n = 0; n < PLD_MAX_NGRAM + 2; n++)
        ix->suffix1[n] = 0;
    for (n = ix->min_n; n <= ix->hi && n <= ix->len; n++) {
        const size_t start = ix->len - n;
        const int64_t *key = ix->tokens + start;
        const pld_table *t = &ix->tables[n];
        int found, probe = 1;
        size_t s;
        if (n == 1 && uni_is_direct(ix, key[0])) {
            const pld_uni *u = uni_entry(ix, key[0]);
            ix->suffix1[1] = u != NULL ? u->pos1 : 0;
            continue;
        }
        if (ix->policy == PLD_POLICY_FIRST && n > ix->min_n && ix->suffix1[n - 1] != 0) {
            const uint32_t first = first_by_derivation(ix, start, ix->suffix1[n - 1],
                                                       PLD_PRED_NONE, &probe);
            if (!probe) {
                ix->suffix1[n] = first;
                continue;
            }
        }
        s = index_probe(ix, n, key, hash_tag(&ix->hk, key, n), &found);
        ix->suffix1[n] = found ? t->slots[s].pos1 : 0;
    }
}

pld_status pld_index_truncate(pld_index *ix, size_t new_len)
{
    size_t p, n;
    if (ix == NULL)
        return PLD_ERR_ARG;
    if (new_len >= ix->len)
        return PLD_OK;
    if (ix->policy == PLD_POLICY_FREQUENT) {
        /* Follower maxima cannot be un-counted: replay the kept prefix.
         * The tables are already large enough, so this cannot fail. */
        const size_t keep = new_len;
        for (n = ix->min_n; n <= ix->hi; n++)
            table_clear(&ix->tables[n]);
        ix->len = 0;
        for (p = 0; p < keep; p++)
            (void)push_token(ix, ix->tokens[p]);
        refresh_suffix(ix);
        return PLD_OK;
    }
    for (n = ix->min_n; n <= ix->hi; n++)
        file_pending(&ix->tables[n]);
    /* Undo the insertions of every removed token, newest first. */
    for (p = ix->len; p-- > new_len;) {
        for (n = ix->min_n; n <= ix->hi && n <= p + 1; n++) {
            pld_table *t = &ix->tables[n];
            const size_t start = p + 1 - n;
            const int64_t *key = ix->tokens + start;
            int found;
            size_t s;
            if (n == 1 && uni_is_direct(ix, key[0])) {
                pld_uni *u = uni_entry(ix, key[0]);
                if (u != NULL && u->pos1 == start + 1)
                    u->pos1 = 0;
                continue;
            }
            s = index_probe(ix, n, key, hash_tag(&ix->hk, key, n), &found);
            if (!found || t->slots[s].pos1 != start + 1)
                continue; /* FIRST: an earlier occurrence stays */
            if (ix->policy == PLD_POLICY_RECENT && ix->prev1[n][start] != 0) {
                t->slots[s].pos1 = ix->prev1[n][start];
            } else {
                table_delete(t, s);
            }
        }
    }
    ix->len = new_len;
    refresh_suffix(ix);
    return PLD_OK;
}

/* ----------------------------------------------------------------- propose */

static size_t cut_at_eos(const int64_t *draft, size_t count,
                         const pld_lookup_opts *opts)
{
    size_t c;
    for (c = 0; c < count; c++)
        if (pld_is_eos(draft[c], opts))
            break;
    return c;
}

/* RECENT with voters > 1: the draft that the occurrences of an n-gram
 * agree on, token by token. The voters are the valid occurrence at cur
 * (+1, the newest valid one) and those before it, at most `voters`, each
 * with its continuation (the rule slice). At depth d those whose
 * continuation is still running vote with its token d; the token most of
 * them give is drafted (a tie: the newest voter's), and only the voters
 * that gave it go on. The draft ends at k tokens or when no voter is
 * left. O(voters * k) reads, and voters^2 compares a token at worst. */
static size_t propose_voted(const pld_index *ix, uint32_t cur, size_t n, size_t k,
                            size_t voters, size_t limit, const pld_lookup_opts *opts,
                            int64_t *out)
{
    size_t start[PLD_MAX_VOTERS], count[PLD_MAX_VOTERS];
    size_t m = 0, d, j, c;
    while (cur != 0 && m < voters) {
        /* every occurrence before a valid one is valid (pld_rule_valid) */
        pld_rule_slice(cur - 1, n, k, limit, opts, &start[m], &count[m]);
        m++;
        cur = ix->prev1[n][cur - 1];
    }
    for (d = 0; d < k; d++) {
        size_t kept = 0, best = 0, best_votes = 0;
        for (j = 0; j < m; j++)
            if (count[j] > d) {
                start[kept] = start[j];
                count[kept++] = count[j];
            }
        m = kept;
        if (m == 0)
            break;
        if (m == 1) { /* one voter left: the rest of its continuation */
            memcpy(out + d, ix->tokens + start[0] + d, (count[0] - d) * sizeof(int64_t));
            return count[0];
        }
        for (j = 0; j < m && best_votes * 2 <= m; j++) {
            const int64_t t = ix->tokens[start[j] + d];
            size_t votes = 0;
            for (c = 0; c < m; c++)
                votes += ix->tokens[start[c] + d] == t;
            if (votes > best_votes) {
                best_votes = votes;
                best = j;
            }
        }
        out[d] = ix->tokens[start[best] + d];
        kept = 0;
        for (j = 0; j < m; j++)
            if (ix->tokens[start[j] + d] == out[d]) {
                start[kept] = start[j];
                count[kept++] = count[j];
            }
        m = kept;
    }
    return d;
}

/* FIRST and RECENT: a slice of the sequence, by the shared rules (RECENT
 * with voters > 1: what the newest valid occurrences agree on). */
static size_t propose_slice(const pld_index *ix, size_t k, size_t voters,
                            const pld_lookup_opts *opts, int64_t *out,
                            size_t *ngram)
{
    const size_t len = ix->len;
    const size_t top = pld_rule_top(len, ix->min_n, ix->max_n, opts);
    const size_t limit = pld_rule_limit(len, opts);
    size_t n;
    if (top == 0)
        return 0;
    for (n = top; n >= ix->min_n; n--) {
        uint32_t cur = ix->suffix1[n];
        while (cur != 0) {
            const size_t i = cur - 1;
            if (pld_rule_valid(i, n, len, k, limit, opts)) {
                size_t start, count;
                if (voters > 1 && ix->policy == PLD_POLICY_RECENT) {
                    count = propose_voted(ix, cur, n, k, voters, limit, opts, out);
                } else {
                    pld_rule_slice(i, n, k, limit, opts, &start, &count);
                    memcpy(out, ix->tokens + start, count * sizeof(int64_t));
                }
                if (opts->n_eos > 0)
                    count = cut_at_eos(out, count, opts);
                *ngram = count ? n : 0;
                return count;
            }
            /* FIRST holds the earliest occurrence: none earlier exists. */
            cur = ix->policy == PLD_POLICY_RECENT ? ix->prev1[n][i] : 0;
        }
    }
    return 0;
}

/* FREQUENT: follow the most frequent follower, token by token. */
static size_t propose_frequent(const pld_index *ix, size_t k,
                               const pld_lookup_opts *opts, int64_t *out,
                               size_t *ngram)
{
    int64_t window[PLD_MAX_NGRAM];
    size_t wlen = ix->len < ix->max_n ? ix->len : ix->max_n;
    size_t limit_k = k, step;
    if (opts->semantics == PLD_TRANSFORMERS && opts->max_length >= 0) {
        const uint64_t room = (uint64_t)opts->max_length;
        limit_k = room <= (uint64_t)ix->len + 1 ? 0 : (size_t)(room - ix->len - 1);
        if (limit_k > k)
            limit_k = k;
    }
    if (wlen > 0)
        memcpy(window, ix->tokens + (ix->len - wlen), wlen * sizeof(int64_t));
    for (step = 0; step < limit_k; step++) {
        int64_t next = 0;
        int have = 0;
        size_t n;
        for (n = wlen; n >= ix->min_n && n >= 1; n--) {
            const pld_table *t = &ix->tables[n];
            const int64_t *key = window + (wlen - n);
            int found;
            size_t s;
            if (t->slots == NULL)
                continue; /* no n-gram of this size seen yet */
            s = index_probe(ix, n, key, hash_tag(&ix->hk, key, n), &found);
            if (found && t->freq[s].best_count > 0) {
                next = ix->tokens[t->freq[s].best_pos1 - 1 + n];
                have = 1;
                break;
            }
        }
        if (!have || pld_is_eos(next, opts))
            break;
        if (step == 0)
            *ngram = n;
        out[step] = next;
        if (wlen == ix->max_n) {
            memmove(window, window + 1, (wlen - 1) * sizeof(int64_t));
            window[wlen - 1] = next;
        } else {
            window[wlen++] = next;
        }
    }
    return step;
}

size_t pld_index_propose_voted(const pld_index *ix, size_t k, size_t voters,
                               const pld_lookup_opts *opts, int64_t *out,
                               size_t *ngram)
{
    size_t unused = 0;
    if (ngram == NULL)
        ngram = &unused;
    *ngram = 0;
    if (ix == NULL || opts == NULL || k == 0 || out == NULL)
        return 0;
    if (ix->policy == PLD_POLICY_FREQUENT)
        return propose_frequent(ix, k, opts, out, ngram);
    if (voters > PLD_MAX_VOTERS)
        voters = PLD_MAX_VOTERS;
    return propose_slice(ix, k, voters, opts, out, ngram);
}

size_t pld_index_propose_n(const pld_index *ix, size_t k,
                           const pld_lookup_opts *opts, int64_t *out,
                           size_t *ngram)
{
    return pld_index_propose_voted(ix, k, 1, opts, out, ngram);
}

size_t pld_index_propose(const pld_index *ix, size_t k,
                         const pld_lookup_opts *opts, int64_t *out)
{
    return pld_index_propose_n(ix, k, opts, out, NULL);
}

/* ------------------------------------------------------------- token tree */

/* Is token one of eos[0..n_eos)? */
static inline int tree_is_eos(int64_t token, const int64_t *eos, size_t n_eos)
{
    size_t e;
    for (e = 0; e < n_eos; e++)
        if (eos[e] == token)
            return 1;
    return 0;
}

pld_status pld_trie_open(pld_trie *t, pld_tree_node *out, size_t n_nodes, size_t max_nodes,
                         const int64_t *eos, size_t n_eos)
{
    size_t k;
    t->nodes = out;
    t->n_nodes = 0;
    t->max_nodes = max_nodes;
    t->root_first = -1;
    t->eos = eos;
    t->n_eos = n_eos;
    if (n_nodes > max_nodes)
        return PLD_ERR_ARG;
    /* Links only point forward and parents only back, so every walk of a
     * sibling list ends within the nodes, however the links were forged. */
    for (k = 0; k < n_nodes; k++) {
        const pld_tree_node *v = &out[k];
        if (v->parent < -1 || v->parent >= (int64_t)k ||
            (v->first_child != -1 &&
             (v->first_child <= (int64_t)k || v->first_child >= (int64_t)n_nodes)) ||
            (v->next_sibling != -1 &&
             (v->next_sibling <= (int64_t)k || v->next_sibling >= (int64_t)n_nodes)))
            return PLD_ERR_ARG;
    }
    for (k = 0; k < n_nodes; k++)
        if (out[k].parent == -1) {
            t->root_first = (int32_t)k; /* children are linked in creation order */
            break;
        }
    t->n_nodes = n_nodes;
    return PLD_OK;
}

/* The child of `parent` (-1: the root) holding token, or -1. */
static inline int32_t tree_child(const pld_trie *t, int32_t parent, int64_t token)
{
    int32_t c = parent < 0 ? t->root_first : t->nodes[parent].first_child;
    while (c >= 0 && t->nodes[c].token != token)
        c = t->nodes[c].next_sibling;
    return c;
}

void pld_trie_insert(pld_trie *t, const int64_t *tokens, size_t count, uint32_t n)
{
    pld_tree_node *nodes = t->nodes;
    int32_t parent = -1;
    size_t j;
    for (j = 0; j < count; j++) {
        const int64_t token = tokens[j];
        int32_t c;
        if (tree_is_eos(token, t->eos, t->n_eos))
            return;
        c = tree_child(t, parent, token);
        if (c < 0) {
            pld_tree_node *v;
            int32_t *link;
            if (t->n_nodes >= t->max_nodes)
                return;
            c = (int32_t)t->n_nodes++;
            v = &nodes[c];
            v->token = token;
            v->parent = parent;
            v->depth = (uint32_t)(j + 1);
            v->ngram = n;
            v->support = 0;
            v->first_child = -1;
            /* appended after its siblings, so children keep creation order */
            v->next_sibling = -1;
            link = parent < 0 ? &t->root_first : &nodes[parent].first_child;
            while (*link >= 0)
                link = &nodes[*link].next_sibling;
            *link = c;
        }
        nodes[c].support++;
        parent = c;
    }
}

/* The arguments every propose_tree shares (pld.h). */
static int tree_args_ok(size_t depth, size_t per_ngram, size_t max_nodes, const void *out,
                        const int64_t *eos, size_t n_eos)
{
    return depth >= 1 && per_ngram >= 1 && per_ngram <= PLD_TREE_MAX_PER_NGRAM &&
           max_nodes <= PLD_TREE_MAX_NODES && (out != NULL || max_nodes == 0) &&
           (eos != NULL || n_eos == 0);
}

pld_status pld_index_propose_tree(const pld_index *ix, size_t depth, size_t per_ngram,
                                  size_t max_nodes, const int64_t *eos, size_t n_eos,
                                  pld_tree_node *out, size_t *n_nodes)
{
    uint32_t used[PLD_MAX_NGRAM * PLD_TREE_MAX_PER_NGRAM]; /* continuation starts taken */
    size_t n_used = 0, top, n;
    pld_trie trie;
    if (n_nodes != NULL)
        *n_nodes = 0;
    if (ix == NULL || n_nodes == NULL || !tree_args_ok(depth, per_ngram, max_nodes, out, eos, n_eos))
        return PLD_ERR_ARG;
    (void)pld_trie_open(&trie, out, 0, max_nodes, eos, n_eos);
    top = ix->max_n < ix->len ? ix->max_n : ix->len;
    for (n = top; n >= ix->min_n && n >= 1; n--) {
        const uint32_t self1 = (uint32_t)(ix->len - n + 1); /* the suffix itself */
        uint32_t cur = ix->suffix1[n], visits = 0;
        uint32_t chosen[PLD_TREE_MAX_PER_NGRAM];
        size_t n_chosen = 0, c;
        if (cur == 0)
            continue;
        /* the earliest occurrence first: the method's own match */
        chosen[n_chosen++] = ix->policy == PLD_POLICY_RECENT ? ix->first1[n][cur - 1] : cur;
        if (ix->policy == PLD_POLICY_RECENT) {
            /* then the latest ones, newest first, at most per_ngram in all */
            while (cur != 0 && n_chosen < per_ngram && visits++ <= per_ngram) {
                if (cur != self1 && cur != chosen[0])
                    chosen[n_chosen++] = cur;
                cur = ix->prev1[n][cur - 1];
            }
        }
        for (c = 0; c < n_chosen; c++) {
            const size_t i = chosen[c] - 1, start = i + n;
            size_t u, count;
            int taken = 0;
            if (chosen[c] == self1 || start >= ix->len)
                continue; /* no token follows */
            for (u = 0; u < n_used && !taken; u++)
                taken = used[u] == (uint32_t)start;
            if (taken)
                continue; /* a longer match already gave this continuation */
            used[n_used++] = (uint32_t)start;
            count = ix->len - start < depth ? ix->len - start : depth;
            pld_trie_insert(&trie, ix->tokens + start, count, (uint32_t)n);
        }
    }
    *n_nodes = trie.n_nodes;
    return PLD_OK;
}

/* An n-gram of the table's size (tag computed) in tables[n], the ring of
 * n-grams not yet filed included: the position (+1) its slot or entry
 * holds; 0 if it is in neither. */
static uint32_t table_lookup(const pld_index *ix, size_t n, const int64_t *key)
{
    const pld_table *t = &ix->tables[n];
    const uint32_t tag = hash_tag(&ix->hk, key, n);
    uint32_t pos1;
    int found;
    size_t s;
    if (t->slots == NULL)
        return 0; /* no n-gram of this size yet */
    if (t->seen != NULL) {
        if (!seen_maybe(t, tag))
            return 0;
        pos1 = pending_find(t, ix->tokens, key, n, tag);
        if (pos1 != 0)
            return pos1;
    }
    s = index_probe(ix, n, key, tag, &found);
    return found ? t->slots[s].pos1 : 0;
}

/* FIRST: the earliest occurrence (+1) of key[0..n) in the sequence; 0 if
 * none. The tables hold only what cannot be derived (see "FIRST files
 * lazily"): with g' = key[1..n) first at p', key occurs first at p' - 1
 * when the token there is key[0]; otherwise at the position tables[n]
 * holds, if it holds key. */
static uint32_t first_occurrence(const pld_index *ix, const int64_t *key, size_t n)
{
    if (n > ix->min_n) {
        const uint32_t p1 = first_occurrence(ix, key + 1, n - 1);
        if (p1 == 0)
            return 0;
        if (p1 >= 2 && ix->tokens[p1 - 2] == key[0])
            return p1 - 1;
    } else if (n == 1 && uni_is_direct(ix, key[0])) {
        const pld_uni *u = uni_entry(ix, key[0]);
        return u != NULL ? u->pos1 : 0;
    }
    return table_lookup(ix, n, key);
}

size_t pld_index_continuations(const pld_index *ix, const int64_t *key, size_t n, size_t max,
                               size_t *starts)
{
    size_t count = 0;
    uint32_t cur;
    if (n > ix->len)
        return 0;
    switch (ix->policy) {
    case PLD_POLICY_RECENT:
        cur = table_lookup(ix, n, key);
        while (cur != 0 && count < max) {
            /* only the newest occurrence can end the sequence */
            if (cur - 1 + n < ix->len)
                starts[count++] = cur - 1 + n;
            cur = ix->prev1[n][cur - 1];
        }
        return count;
    case PLD_POLICY_FREQUENT:
        cur = table_lookup(ix, n, key); /* every n-gram is filed, at its earliest */
        break;
    default:
        cur = first_occurrence(ix, key, n);
        break;
    }
    if (cur != 0 && cur - 1 + n < ix->len)
        starts[count++] = cur - 1 + n;
    return count;
}

/* The step of a RECENT chain at occurrence cur (+1, not 0) of an n-gram:
 * the tokens around its continuation (the one before the n-gram, which
 * tells whether a longer n took it, and the first of the continuation) and
 * its link to the occurrence before. Addresses stay inside the arrays. */
static inline void prefetch_occurrence(const pld_index *ix, size_t n, uint32_t cur)
{
    const size_t at = cur - 1 + n; /* the continuation's start, <= len */
    PLD_PREFETCH(ix->tokens + (cur >= 2 ? cur - 2 : 0));
    PLD_PREFETCH(ix->tokens + (at < ix->len ? at : ix->len - 1));
    PLD_PREFETCH(ix->prev1[n] + (cur - 1));
}

void pld_index_continuations_many(pld_probe *probes, size_t count, size_t max)
{
    size_t i, live = 0;
    for (i = 0; i < count; i++) { /* every home slot asked for at once */
        pld_probe *p = &probes[i];
        const pld_index *ix = p->index;
        const pld_table *t = &ix->tables[p->n];
        p->found = 0;
        p->cur = 0;
        if (ix->policy != PLD_POLICY_RECENT || t->seen != NULL) {
            p->found = pld_index_continuations(ix, p->key, p->n, max, p->starts);
            continue;
        }
        if (p->n > ix->len || t->slots == NULL)
            continue;
        p->tag = hash_tag(&ix->hk, p->key, p->n);
        p->cur = UINT32_MAX; /* to probe */
        PLD_PREFETCH(&t->slots[p->tag & t->mask]);
    }
    for (i = 0; i < count; i++) { /* the first slot with the tag: a guess */
        pld_probe *p = &probes[i];
        const pld_table *t;
        size_t s;
        if (p->cur != UINT32_MAX)
            continue;
        t = &p->index->tables[p->n];
        for (s = p->tag & t->mask; t->slots[s].pos1 != 0 && t->slots[s].tag != p->tag;
             s = (s + 1) & t->mask)
            ;
        p->cur = t->slots[s].pos1; /* 0: the n-gram is not there */
        if (p->cur != 0)
            prefetch_occurrence(p->index, p->n, p->cur);
    }
    for (i = 0; i < count; i++) { /* the guesses checked: the newest occurrences */
        pld_probe *p = &probes[i];
        const pld_index *ix = p->index;
        if (p->cur == 0)
            continue;
        if (!tag_is_key(ix, p->key, p->n) &&
            !keys_equal(ix->tokens + (p->cur - 1), p->key, p->n)) {
            int found; /* another n-gram with the same tag: probe in full */
            const size_t s = index_probe(ix, p->n, p->key, p->tag, &found);
            p->cur = found ? ix->tables[p->n].slots[s].pos1 : 0;
            if (p->cur == 0)
                continue;
        }
        live++;
    }
    while (live > 0) { /* one step down every chain a round */
        live = 0;
        for (i = 0; i < count; i++) {
            pld_probe *p = &probes[i];
            const pld_index *ix = p->index;
            const uint32_t cur = p->cur;
            if (cur == 0 || p->found >= max)
                continue;
            /* as pld_index_continuations: the newest may end the sequence */
            if (cur - 1 + p->n < ix->len)
                p->starts[p->found++] = cur - 1 + p->n;
            p->cur = ix->prev1[p->n][cur - 1];
            if (p->cur != 0 && p->found < max) {
                prefetch_occurrence(ix, p->n, p->cur);
                live++;
            }
        }
    }
}

pld_status pld_index_propose_tree_after(const pld_index *ix, const int64_t *context, size_t clen,
                                        size_t depth, size_t per_ngram, size_t max_nodes,
                                        const int64_t *eos, size_t n_eos, pld_tree_node *out,
                                        size_t *n_nodes)
{
    size_t top, n, c;
    size_t starts[PLD_TREE_MAX_PER_NGRAM];
    pld_trie trie;
    if (ix == NULL || n_nodes == NULL || (context == NULL && clen > 0) ||
        !tree_args_ok(depth, per_ngram, max_nodes, out, eos, n_eos) ||
        pld_trie_open(&trie, out, *n_nodes, max_nodes, eos, n_eos) != PLD_OK)
        return PLD_ERR_ARG;
    top = ix->max_n < clen ? ix->max_n : clen;
    for (n = top; n >= ix->min_n && n >= 1; n--) {
        const int64_t *key = context + (clen - n);
        const size_t found = pld_index_continuations(ix, key, n, per_ngram, starts);
        for (c = 0; c < found; c++) {
            const size_t start = starts[c];
            /* Taken by a longer n: the candidates of one n are the newest (or
             * the earliest) of its occurrences, and those of n + 1 are
             * occurrences of n too, so a start is taken iff the (n+1)-gram
             * before it is the context's too (n + 1 <= top). */
            if (n < top && start >= n + 1 && ix->tokens[start - n - 1] == context[clen - n - 1])
                continue;
            pld_trie_insert(&trie, ix->tokens + start,
                            ix->len - start < depth ? ix->len - start : depth, (uint32_t)n);
        }
    }
    *n_nodes = trie.n_nodes;
    return PLD_OK;
}

void pld_index_shrink_to_fit(pld_index *ix)
{
    const size_t len = ix->len;
    size_t n;
    if (len == 0 || len >= ix->cap)
        return;
    /* Each array keeps at least len entries whether or not its realloc
     * succeeds, so cap = len holds for all of them afterwards. */
    {
        int64_t *tokens = realloc(ix->tokens, len * sizeof(int64_t));
        if (tokens != NULL)
            ix->tokens = tokens;
    }
    if (ix->policy == PLD_POLICY_RECENT) {
        for (n = ix->min_n; n <= ix->max_n; n++) {
            uint32_t *prev = realloc(ix->prev1[n], len * sizeof(uint32_t)), *first;
            if (prev != NULL)
                ix->prev1[n] = prev;
            first = realloc(ix->first1[n], len * sizeof(uint32_t));
            if (first != NULL)
                ix->first1[n] = first;
        }
    }
    ix->cap = len;
}

/* --------------------------------------------------------------- accessors */

size_t pld_index_len(const pld_index *ix) { return ix->len; }
const int64_t *pld_index_tokens(const pld_index *ix) { return ix->tokens; }
size_t pld_index_min_n(const pld_index *ix) { return ix->min_n; }
size_t pld_index_max_n(const pld_index *ix) { return ix->max_n; }
pld_policy pld_index_policy(const pld_index *ix) { return ix->policy; }

size_t pld_index_nbytes(const pld_index *ix)
{
    size_t total = sizeof(*ix) + ix->cap * sizeof(int64_t), n;
    for (n = ix->min_n; n <= ix->hi; n++) {
        const pld_table *t = &ix->tables[n];
        if (t->slots)
            total += (t->mask + 1) *
                     (sizeof(pld_slot) + (t->freq ? sizeof(pld_freq) : 0));
        if (t->seen)
            total += seen_words(t->mask + 1) * sizeof(uint64_t);
    }
    if (ix->policy == PLD_POLICY_RECENT)
        total += 2 * (ix->max_n - ix->min_n + 1) * ix->cap * sizeof(uint32_t);
    total += ix->uni_cap * sizeof(pld_uni);
    return total;
}

uint64_t pld_index_key(const pld_index *ix) { return ix->key; }

uint32_t pld_index_ngram_tag(const int64_t *key_tokens, size_t n, uint64_t hash_key)
{
    const pld_hash_key hk = hash_key_make(hash_key);
    return hash_tag(&hk, key_tokens, n);
}
