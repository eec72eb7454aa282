"""Plain-Python reference implementations of pld's lookup and acceptance
semantics.

Written from the method's description and csrc/pld.h (the contract), in the
most naive way: every window of the sequence is compared with the suffix
n-gram, exactly as the original torch function does with ``unfold``. Nothing
here is meant to be fast; everything here is meant to be obviously right.

Semantics (see pld.h):

* ``"seed"`` -- the method's ``find_candidate_pred_tokens``: for n from max_n
  down to min_n (n > L skipped), walk the occurrences of the suffix n-gram
  left to right; the first one with ``i + n + k <= L`` (full continuation)
  and ``i + n < L - n`` (not the trailing self-match) yields
  ``seq[i+n : i+n+k]``.
* ``"transformers"`` -- ``PromptLookupCandidateGenerator.get_candidates``
  without logits processors: empty if ``max_length == L + 1``; for n from
  ``min(max_n, L - 1)`` down to min_n, the first occurrence with
  ``start < end`` where ``start = i + n`` and ``end = min(start + k, L,
  max_length)`` yields ``seq[start:end]`` cut before its first eos; a draft
  cut to nothing is empty (no further n is tried).

Acceptance of a verified token tree (``accept_greedy_tree``,
``accept_sample_tree``; pld.h's walk): from the root, the model's token at
the current position; the first child of the current node with that token
is accepted and becomes the current node, until none is.
"""

from __future__ import annotations

from typing import Iterable, Sequence

SEMANTICS = ("seed", "transformers")
POLICIES = ("first", "recent", "frequent")

_INF = float("inf")


def _check(max_n: int, k: int, min_n: int, semantics: str, max_length, eos) -> None:
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics: unknown {semantics!r}")
    if not (1 <= min_n <= max_n):
        raise ValueError("need 1 <= min_n <= max_n")
    if k < 1:
        raise ValueError("need k >= 1")
    if semantics == "seed" and (max_length is not None or tuple(eos)):
        raise ValueError("max_length / eos only with transformers semantics")


def _occurrences(seq: Sequence[int], n: int) -> list[int]:
    """All window starts i (0 <= i <= L - n) with seq[i:i+n] == seq[L-n:]."""
    L = len(seq)
    ngram = list(seq[L - n:])
    return [i for i in range(L - n + 1) if list(seq[i:i + n]) == ngram]


def _cut_at_eos(draft: list[int], eos: Iterable[int]) -> list[int]:
    eos = set(eos)
    for j, t in enumerate(draft):
        if t in eos:
            return draft[:j]
    return draft


def _seed_valid(i: int, n: int, k: int, L: int) -> bool:
    start = i + n
    end = start + k
    return end <= L and start < L - n


def _transformers_bounds(i: int, n: int, k: int, L: int, max_length):
    start = i + n
    end = min(start + k, L, _INF if max_length is None else max_length)
    return start, int(end) if end != _INF else end


def _vote(continuations: list) -> list[int]:
    """The draft that continuations (newest first) agree on: at each depth
    those still running vote with their token; the most given wins (a tie:
    the newest's), and only those that gave it go on."""
    draft: list[int] = []
    voters = list(continuations)
    while True:
        d = len(draft)
        voters = [c for c in voters if len(c) > d]
        if not voters:
            return draft
        votes = [sum(other[d] == c[d] for other in voters) for c in voters]
        token = voters[votes.index(max(votes))][d]
        draft.append(token)
        voters = [c for c in voters if c[d] == token]


def _lookup(seq, max_n, k, min_n, semantics, max_length, eos, pick_latest, voters=1):
    """``voters`` > 1 (with pick_latest): the newest ``voters`` valid
    occurrences of the winning n vote on the draft (pld_index_propose_voted)."""
    seq = [int(t) for t in seq]
    L = len(seq)
    if semantics == "seed":
        for n in range(max_n, min_n - 1, -1):
            if n > L:
                continue
            valid = [i for i in _occurrences(seq, n) if _seed_valid(i, n, k, L)]
            if valid:
                if pick_latest and voters > 1:
                    return _vote([seq[i + n:i + n + k] for i in valid[::-1][:voters]])
                i = valid[-1] if pick_latest else valid[0]
                return seq[i + n:i + n + k]
        return []
    # transformers
    if max_length is not None and max_length == L + 1:
        return []
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        valid = []
        for i in _occurrences(seq, n):
            start, end = _transformers_bounds(i, n, k, L, max_length)
            if start < end:
                valid.append((start, end))
        if valid:
            if pick_latest and voters > 1:
                return _cut_at_eos(_vote([seq[a:b] for a, b in valid[::-1][:voters]]), eos)
            start, end = valid[-1] if pick_latest else valid[0]
            return _cut_at_eos(seq[start:end], eos)
    return []


def find_candidate_reference(seq: Sequence[int], max_n: int, k: int, min_n: int = 1,
                             semantics: str = "seed", max_length=None,
                             eos: Iterable[int] = ()) -> list[int]:
    """Reference for ``pld.find_candidate_pred_tokens`` (returns a list)."""
    eos = tuple(eos)
    _check(max_n, k, min_n, semantics, max_length, eos)
    return _lookup(seq, max_n, k, min_n, semantics, max_length, eos, pick_latest=False)


def _frequent_follower(seq: list[int], ngram: list[int]):
    """The most frequent follower of ``ngram`` in ``seq``, or None.

    Built by replaying the sequence left to right, as an incremental index
    would: each occurrence of the n-gram that has a follower bumps that
    follower's count, and the best follower changes only when another one
    gets a strictly larger count -- so a tie goes to the follower that
    reached the count first.
    """
    n = len(ngram)
    counts: dict[int, int] = {}
    best, best_count = None, 0
    for j in range(n, len(seq)):  # seq[j] follows the window seq[j-n:j]
        if seq[j - n:j] == ngram:
            f = seq[j]
            counts[f] = counts.get(f, 0) + 1
            if counts[f] > best_count:
                best, best_count = f, counts[f]
    return best


class ReferenceIndex:
    """Reference for ``pld.NgramIndex``: keeps the list and recomputes."""

    def __init__(self, max_ngram_size: int = 3, min_ngram_size: int = 1,
                 policy: str = "first", voters: int = 1):
        if not (1 <= min_ngram_size <= max_ngram_size):
            raise ValueError("need 1 <= min_ngram_size <= max_ngram_size")
        if policy not in POLICIES:
            raise ValueError(f"policy: unknown {policy!r}")
        self.max_ngram_size = max_ngram_size
        self.min_ngram_size = min_ngram_size
        self.policy = policy
        self.voters = voters
        self._seq: list[int] = []

    def extend(self, tokens) -> None:
        if isinstance(tokens, int):
            self._seq.append(tokens)
        else:
            self._seq.extend(int(t) for t in tokens)

    def truncate(self, n: int) -> None:
        if n < 0:
            raise ValueError("n must be >= 0")
        del self._seq[n:]

    def __len__(self) -> int:
        return len(self._seq)

    def tokens(self) -> list[int]:
        return list(self._seq)

    def propose(self, num_pred_tokens: int = 10, semantics: str = "seed",
                max_length=None, eos_token_id=None) -> list[int]:
        eos = _eos_tuple(eos_token_id)
        k = num_pred_tokens
        _check(self.max_ngram_size, k, self.min_ngram_size, semantics, max_length, eos)
        if self.policy in ("first", "recent"):
            return _lookup(self._seq, self.max_ngram_size, k, self.min_ngram_size,
                           semantics, max_length, eos,
                           pick_latest=(self.policy == "recent"), voters=self.voters)
        return self._propose_frequent(k, semantics, max_length, eos)

    def _propose_frequent(self, k, semantics, max_length, eos) -> list[int]:
        seq = self._seq
        L = len(seq)
        limit = k
        if semantics == "transformers" and max_length is not None:
            limit = min(limit, max_length - L - 1)
        eos = set(eos) if semantics == "transformers" else set()
        draft: list[int] = []
        while len(draft) < limit:
            ext = seq + draft
            nxt = None
            for n in range(self.max_ngram_size, self.min_ngram_size - 1, -1):
                if n > len(ext):
                    continue
                nxt = _frequent_follower(seq, ext[len(ext) - n:])
                if nxt is not None:
                    break
            if nxt is None or nxt in eos:
                break
            draft.append(nxt)
        return draft


def _eos_tuple(eos_token_id) -> tuple:
    if eos_token_id is None:
        return ()
    if isinstance(eos_token_id, int):
        return (eos_token_id,)
    return tuple(int(t) for t in eos_token_id)


class _Trie:
    """The five lists of a token trie, grown one candidate at a time as
    pld.h's tree functions grow one (a token already a child is shared;
    a new node is appended unless the trie is full)."""

    def __init__(self, max_nodes: int, eos: Iterable[int] = (), lists=None):
        self.max_nodes, self.eos = max_nodes, set(eos)
        self.lists = tuple(list(x) for x in lists) if lists else ([], [], [], [], [])
        tokens, parents = self.lists[0], self.lists[1]
        self.children = {(parents[v], tokens[v]): v for v in range(len(tokens))}

    def insert(self, cand: Sequence[int], n: int) -> None:
        tokens, parents, depths, ngrams, supports = self.lists
        parent = -1
        for j, t in enumerate(cand):
            if t in self.eos:
                break
            node = self.children.get((parent, t))
            if node is None:
                if len(tokens) >= self.max_nodes:
                    break
                node = len(tokens)
                self.children[(parent, t)] = node
                tokens.append(t)
                parents.append(parent)
                depths.append(j + 1)
                ngrams.append(n)
                supports.append(0)
            supports[node] += 1
            parent = node


def propose_tree_reference(seq: Sequence[int], max_n: int, min_n: int, policy: str, depth: int,
                           per_ngram: int = 4, max_nodes: int = 64, eos: Iterable[int] = ()):
    """Reference for ``NgramIndex.propose_tree``: the trie of candidate
    continuations, as the five lists (tokens, parents, depths, ngrams,
    supports). Written from pld.h's contract with plain lists: candidates
    in order (n descending; the earliest occurrence, then for "recent" the
    newest ones among the first per_ngram + 1 of the chain), a continuation
    start taken once, each candidate inserted from the root until the trie
    is full."""
    seq = [int(t) for t in seq]
    L = len(seq)
    trie = _Trie(max_nodes, eos)
    used: set = set()
    for n in range(min(max_n, L), min_n - 1, -1):
        occ = _occurrences(seq, n)  # ascending; the suffix itself is last
        chosen = [occ[0]]
        if policy == "recent":
            newest_first = occ[::-1][:per_ngram + 1]
            chosen += [i for i in newest_first if i != L - n and i != occ[0]][:per_ngram - 1]
        for i in chosen:
            start = i + n
            if start >= L or start in used:
                continue
            used.add(start)
            trie.insert(seq[start:start + depth], n)
    return trie.lists


# ---------------------------------------------------------------- corpus lookup


def _candidate_starts(seq: Sequence[int], key: Sequence[int], recent: bool, per_ngram: int) -> list:
    """i + n for the occurrences i of key in seq with i + n < len(seq): the
    newest per_ngram, newest first (recent), else the earliest one."""
    n, L = len(key), len(seq)
    occ = [i for i in range(L - n) if list(seq[i:i + n]) == list(key)]
    chosen = occ[::-1][:per_ngram] if recent else occ[:1]
    return [i + n for i in chosen]


def propose_tree_after_reference(seq: Sequence[int], max_n: int, min_n: int, policy: str,
                                 context: Sequence[int], depth: int, per_ngram: int = 4,
                                 max_nodes: int = 64, eos: Iterable[int] = (), into=None):
    """Reference for ``NgramIndex.propose_tree_after`` (pld.h,
    pld_index_propose_tree_after): the continuations in ``seq`` of the
    suffix n-grams of ``context``, for n from min(max_n, len(context)) down
    to min_n -- the newest per_ngram occurrences ("recent") or the earliest
    (other policies), a continuation start taken once -- merged into the
    trie ``into`` (five lists; None: a fresh one). Returns the five lists."""
    seq, context = [int(t) for t in seq], [int(t) for t in context]
    trie = _Trie(max_nodes, eos, into)
    used: set = set()
    for n in range(min(max_n, len(context)), min_n - 1, -1):
        for start in _candidate_starts(seq, context[len(context) - n:], policy == "recent", per_ngram):
            if start in used:
                continue
            used.add(start)
            trie.insert(seq[start:start + depth], n)
    return trie.lists


class ReferenceCorpus:
    """Reference for pld.Corpus (pld.h, "Corpus"): segments as plain lists,
    each sequence followed by -1; the same rules for starting a segment,
    dropping the oldest and looking up."""

    def __init__(self, max_tokens: int, min_ngram: int = 2, max_ngram: int = 4, segments: int = 4):
        self.max_tokens, self.min_n, self.max_n, self.max_segments = max_tokens, min_ngram, max_ngram, segments
        self.target = -(-max_tokens // segments)
        self.segs: list = []  # oldest first: lists of sequences
        self.evicted = 0

    def __len__(self) -> int:
        return sum(len(s) for seg in self.segs for s in seg)

    @property
    def num_sequences(self) -> int:
        return sum(len(seg) for seg in self.segs)

    @property
    def max_id(self) -> int:
        return max((max(s) for seg in self.segs for s in seg), default=-1)

    def sequences(self) -> list:
        return [list(s) for seg in self.segs for s in seg]

    def clear(self) -> None:
        self.segs = []

    def _drop_oldest(self) -> None:
        self.evicted += len(self.segs.pop(0))

    def add(self, tokens: Sequence[int]) -> None:
        tokens = [int(t) for t in tokens]
        if len(tokens) > self.max_tokens or any(t < 0 for t in tokens):
            raise ValueError("tokens")
        if not tokens:
            return
        newest = sum(len(s) for s in self.segs[-1]) if self.segs else None
        if newest is None or newest >= self.target or newest + len(tokens) > self.max_tokens:
            if len(self.segs) == self.max_segments:
                self._drop_oldest()
            self.segs.append([])
        self.segs[-1].append(tokens)
        while len(self) > self.max_tokens and len(self.segs) > 1:
            self._drop_oldest()

    def propose_tree(self, context: Sequence[int], depth: int, per_ngram: int = 4, max_nodes: int = 64,
                     eos_token_id=None):
        context = [int(t) for t in context]
        trie = _Trie(max_nodes, _eos_tuple(eos_token_id))
        top = 0  # the longest suffix without a negative id, at most max_n
        while top < min(self.max_n, len(context)) and context[len(context) - 1 - top] >= 0:
            top += 1
        flat = [[t for s in seg for t in s + [-1]] for seg in self.segs]
        used = [set() for _ in flat]
        for n in range(top, self.min_n - 1, -1):
            key = context[len(context) - n:]
            for j in range(len(flat) - 1, -1, -1):
                for start in _candidate_starts(flat[j], key, True, per_ngram):
                    if start in used[j]:
                        continue
                    used[j].add(start)
                    cand = flat[j][start:start + depth]
                    if -1 in cand:
                        cand = cand[:cand.index(-1)]
                    trie.insert(cand, n)
        return trie.lists


# ------------------------------------------------------------- acceptance
def _tree_parents(tokens: Sequence[int], parents) -> list:
    """The parents as given, or a chain's; each must lie in [-1, i)."""
    parents = list(range(-1, len(tokens) - 1)) if parents is None else [int(p) for p in parents]
    if len(parents) != len(tokens) or any(not -1 <= p < i for i, p in enumerate(parents)):
        raise ValueError("parents: each parents[i] must lie in [-1, i)")
    return parents


def tree_depth(parents: Sequence[int]) -> int:
    """The deepest node's depth (the root's is 0), by climbing from each node."""
    deepest = 0
    for i in range(len(parents)):
        d, v = 0, i
        while v >= 0:
            d, v = d + 1, parents[v]
        deepest = max(deepest, d)
    return deepest


def _walk(tokens: Sequence[int], parents: Sequence[int], token_at) -> tuple:
    """pld.h's walk: ``token_at(position, depth)`` is the model's token at a
    position (0: the root, 1 + i: node i). Returns (path, accepted)."""
    path: list = []
    accepted: list = []
    node = -1
    while True:
        t = token_at(node + 1, len(path))
        accepted.append(t)
        children = [c for c in range(len(tokens)) if c > node and parents[c] == node and tokens[c] == t]
        if not children:
            return path, accepted
        node = children[0]  # the first such child
        path.append(node)


def accept_greedy_tree(tokens: Sequence[int], choices: Sequence[int], parents=None) -> tuple:
    """pld.accept_greedy: the model's token at position p is choices[p]."""
    tokens = [int(t) for t in tokens]
    parents = _tree_parents(tokens, parents)
    choices = [int(c) for c in choices]
    if len(choices) < len(tokens) + 1:
        raise ValueError("choices: expected at least len(tokens) + 1 ids")
    return _walk(tokens, parents, lambda position, depth: choices[position])


def inverse_cdf(row: Sequence[float], u: float) -> int:
    """The least v with row[v] > 0 and u * sum(row) < row[0] + ... + row[v]
    (sums in float64, in index order); the last v with row[v] > 0 if
    rounding leaves none. ValueError for a NaN, negative or infinite entry,
    or no mass."""
    row = [float(p) for p in row]
    total = 0.0
    for p in row:
        if not (p >= 0.0) or p == _INF:
            raise ValueError("probs: a row with a NaN, a negative or an infinite entry")
        total += p
    if not total > 0.0:
        raise ValueError("probs: a row without mass")
    acc, last = 0.0, None
    for v, p in enumerate(row):
        if p > 0.0:
            last = v
            acc += p
            if u * total < acc:
                return v
    return last


def accept_sample_tree(tokens: Sequence[int], probs, uniforms: Sequence[float], parents=None) -> tuple:
    """pld.accept_sample: the model's token at a position of depth d is
    inverse_cdf(its row of probs, uniforms[d]). ``probs``: rows of floats
    (at least len(tokens) + 1 of them), as the C core reads them."""
    tokens = [int(t) for t in tokens]
    parents = _tree_parents(tokens, parents)
    uniforms = [float(u) for u in uniforms]
    if len(uniforms) < 1 + tree_depth(parents):
        raise ValueError("uniforms: expected at least 1 + the tree's depth values")
    if len(probs) < len(tokens) + 1:
        raise ValueError("probs: expected at least len(tokens) + 1 rows")
    return _walk(tokens, parents, lambda position, depth: inverse_cdf(probs[position], uniforms[depth]))
