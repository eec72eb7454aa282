"""A token tree of drafts: which nodes to verify, and how they see each other.

The index (``NgramIndex.propose_tree``) merges several candidate
continuations of the sequence into a trie. A step then

1. scores each node with the estimated probability that the model accepts
   it given that its parent was accepted (:class:`AcceptanceModel`: learned
   online within the generation, per n-gram size, support, depth and
   agreement with what the model last predicted after the tokens before
   the node, from a prior), so the probability that a node is reached is the
   product along its path;
2. picks the W nodes most likely to be reached -- an ancestor-closed set,
   since a child is never likelier than its parent -- with W maximising the
   expected tokens of the step per unit of forward cost, ``(1 + sum of the
   W probabilities) / c(pending + W)``, from the measured cost model
   (:mod:`pld.forward_cost`). W = 0 (no draft) and a single chain (a linear
   draft) are among the choices, so the choice is never worse than either
   in expectation;
3. verifies them in one forward: each node at position ``last + depth``,
   attending to the context, its ancestors and itself
   (:func:`block_visibility`: what a step's new tokens see of each other).

Nothing here changes what is generated: acceptance walks from the root
along the model's own choices (pld.accept_walk).
"""
from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

# The acceptance model's buckets: their layout and meaning are there.
from .acceptance_buckets import (AGREEMENT_BUCKETS, CORPUS, DEPTH_EDGES, DISAGREES, NGRAM_BUCKETS,
                                 ORIGINS, PAIR_AGREES, ROW, SIBLING, SUPPORT_BUCKETS, TOKEN_AGREES,
                                 UNKNOWN)

#: The prior: P(a node is accepted | its parent was) by [source / n-gram
#: bucket][support or rank bucket][depth bucket][agreement bucket]
#: (UNKNOWN's rate is the bucket's rate over every agreement). Fitted on the embedded
#: model with ``python -m pld bench tree-prior --tasks summarization,rag
#: --skip 40 --limit 40 --max-new-tokens 128 --successors --width 48
#: --threads 2`` (Spec-Bench prompts 41-80 of each task, the first 48 nodes
#: of every tree verified; pld/bench/tree_prior.py), so not on the prompts
#: the reported runs use (the first 20 of each task).
PRIOR = (
    (  # successors: by support, depth, agreement
        (
            (0.37, 0.32, 0.33, 0.33),
            (0.44, 0.19, 0.31, 0.31),
            (0.43, 0.16, 0.31, 0.31),
            (0.33, 0.09, 0.22, 0.22),
            (0.26, 0.22, 0.23, 0.23),
        ),
        (
            (0.07, 0.07, 0.07, 0.07),
            (0.06, 0.06, 0.06, 0.06),
            (0.05, 0.05, 0.04, 0.05),
            (0.12, 0.12, 0.12, 0.12),
            (0.12, 0.12, 0.12, 0.12),
        ),
        (
            (0.03, 0.03, 0.03, 0.03),
            (0.12, 0.12, 0.12, 0.12),
            (0.12, 0.12, 0.12, 0.12),
            (0.12, 0.12, 0.12, 0.12),
            (0.12, 0.12, 0.12, 0.12),
        ),
    ),
    (  # 1-grams: by support, depth, agreement
        (
            (0.6, 0.38, 0.04, 0.09),
            (0.63, 0.32, 0.09, 0.26),
            (0.78, 0.53, 0.23, 0.54),
            (0.91, 0.84, 0.47, 0.74),
            (0.96, 0.84, 0.63, 0.84),
        ),
        (
            (0.51, 0.54, 0.12, 0.26),
            (0.68, 0.61, 0.15, 0.47),
            (0.9, 0.75, 0.39, 0.72),
            (0.89, 0.87, 0.8, 0.85),
            (0.97, 0.95, 0.97, 0.95),
        ),
        (
            (0.6, 0.74, 0.31, 0.58),
            (0.89, 0.84, 0.76, 0.82),
            (0.91, 0.84, 0.67, 0.84),
            (0.92, 0.91, 0.93, 0.91),
            (0.95, 0.95, 0.95, 0.95),
        ),
    ),
    (  # 2-grams: by support, depth, agreement
        (
            (0.58, 0.24, 0.08, 0.21),
            (0.69, 0.52, 0.14, 0.37),
            (0.83, 0.76, 0.41, 0.62),
            (0.87, 0.83, 0.54, 0.76),
            (0.9, 0.85, 0.72, 0.82),
        ),
        (
            (0.54, 0.45, 0.15, 0.34),
            (0.67, 0.62, 0.41, 0.58),
            (0.9, 0.84, 0.7, 0.8),
            (0.91, 0.89, 0.81, 0.87),
            (0.84, 0.8, 0.65, 0.8),
        ),
        (
            (0.77, 0.81, 0.44, 0.68),
            (0.93, 0.78, 0.68, 0.84),
            (0.9, 0.86, 0.76, 0.86),
            (0.92, 0.92, 0.93, 0.92),
            (0.96, 0.95, 0.95, 0.95),
        ),
    ),
    (  # 3-grams: by support, depth, agreement
        (
            (0.68, 0.41, 0.24, 0.4),
            (0.87, 0.69, 0.49, 0.63),
            (0.94, 0.77, 0.59, 0.76),
            (0.97, 0.88, 0.65, 0.82),
            (0.97, 0.87, 0.66, 0.85),
        ),
        (
            (0.84, 0.74, 0.48, 0.71),
            (0.88, 0.83, 0.66, 0.79),
            (0.98, 0.92, 0.76, 0.91),
            (0.96, 0.94, 0.82, 0.92),
            (0.97, 0.91, 0.81, 0.91),
        ),
        (
            (0.93, 0.88, 0.76, 0.89),
            (0.99, 0.96, 0.82, 0.95),
            (1.0, 0.98, 0.95, 0.98),
            (1.0, 0.99, 0.95, 0.99),
            (1.0, 1.0, 1.0, 1.0),
        ),
    ),
)
#: How many observations the prior is worth in each bucket.
PRIOR_WEIGHT = 4.0
#: Accepted nodes a step per predicted accepted node (the sum of the chosen
#: nodes' reach): the per-node rates treat a path's nodes as independent,
#: but acceptance runs in streaks, so the sum underestimates. Measured by
#: the same tree-prior run (``--scale-width 12``: the 12 likeliest nodes a
#: step under the fitted prior, prompts 41-80): 5,069 accepted for 4,055
#: predicted over 2,677 steps.
PRIOR_SCALE = 1.25
#: How many predicted accepted nodes the prior scale is worth.
SCALE_WEIGHT = 8.0
#: A node is never given a probability above this (and siblings share at most 1).
MAX_PROBABILITY = 0.98
#: The width budget scores a node at its bucket's rate plus this many
#: standard deviations of the rate's posterior (Beta, its pseudo-counts
#: the prior's weight plus the trials). A node is only tried, and its
#: bucket only learns, if it is verified: scored at the mean, a bucket
#: whose rate fell after a few misses early in a generation is verified
#: less and stays low. With 12 nodes verified every step (prompts 45-50 of
#: summarization and rag, embedded model), the 27 steps whose nodes the
#: mean predicted 0.16 accepted tokens got 1.11. Chosen on prompts 41-60 of
#: each (two runs, 0, 0.5 and 1 compared): 1 raised tokens per forward
#: from 1.88-1.92 to 2.18-2.19 (summarization) and 3.05-3.15 to 3.44-3.48
#: (rag), tokens/s within the runs' noise (about 5%).
EXPLORATION = 1.0


@dataclass
class TokenTree:
    """Nodes in creation order (a parent before its children); parent -1 is
    the root, the sequence's last token."""

    tokens: List[int]
    parents: List[int]
    depths: List[int]
    ngrams: List[int]
    supports: List[int]
    #: per node, its agreement bucket (PAIR_AGREES ... UNKNOWN); None: all UNKNOWN
    agreement: Optional[List[int]] = None
    #: per node, where its text was found (ROW, SIBLING, CORPUS); None: all ROW
    origins: Optional[List[int]] = None

    @classmethod
    def from_index(cls, index, depth: int, per_ngram: int, max_nodes: int,
                   eos: Sequence[int] = ()) -> "TokenTree":
        return cls(*index.propose_tree(depth, per_ngram=per_ngram, max_nodes=max_nodes,
                                       eos_token_id=list(eos) or None))

    def __len__(self) -> int:
        return len(self.tokens)


def with_subtree(tree: TokenTree, token: int, ngram: int, support: int, below: TokenTree
                 ) -> TokenTree:
    """``tree`` with a new child ``token`` of the root (n-gram size
    ``ngram``, ``support``) and, below it, the nodes of ``below`` (a tree
    rooted at that token) one level deeper."""
    out = TokenTree(list(tree.tokens) + [token], list(tree.parents) + [-1],
                    list(tree.depths) + [1], list(tree.ngrams) + [ngram],
                    list(tree.supports) + [support])
    base = len(tree.tokens)
    out.tokens += below.tokens
    out.parents += [base if p < 0 else base + 1 + p for p in below.parents]
    out.depths += [d + 1 for d in below.depths]
    out.ngrams += below.ngrams
    out.supports += below.supports
    if tree.origins is not None or below.origins is not None:
        out.origins = origins_of(tree) + [ROW] + origins_of(below)
    return out


def within_vocabulary(tree: TokenTree, vocab: Optional[int]) -> TokenTree:
    """``tree`` without the nodes whose token is not an id in [0, vocab)
    (nor their descendants); ``tree`` itself when every node is (or vocab
    is None: unknown)."""
    if vocab is None or all(0 <= t < vocab for t in tree.tokens):
        return tree
    ok: List[bool] = []
    for t, p in zip(tree.tokens, tree.parents):
        ok.append(0 <= t < vocab and (p < 0 or ok[p]))
    return subtree(tree, [j for j, keep in enumerate(ok) if keep])


def subtree(tree: TokenTree, kept: Sequence[int]) -> TokenTree:
    """The nodes ``kept`` of ``tree`` (creation order, each node's parent
    among them), with their features, as a tree of their own."""
    def pick(values: Optional[List[int]]) -> Optional[List[int]]:
        return None if values is None else [values[j] for j in kept]

    return TokenTree(pick(tree.tokens), local_parents(tree, kept), pick(tree.depths), pick(tree.ngrams),
                     pick(tree.supports), pick(tree.agreement), pick(tree.origins))


def origins_of(tree: TokenTree) -> List[int]:
    """Every node's origin (ROW where the tree records none)."""
    return list(tree.origins) if tree.origins is not None else [ROW] * len(tree.tokens)


def with_origin(tree: TokenTree, origin: int) -> TokenTree:
    """``tree`` with every node marked as found in ``origin``."""
    tree.origins = [origin] * len(tree.tokens)
    return tree


def parent_tokens(tree: TokenTree, root: int) -> List[int]:
    """Each node's parent's token (``root``, the sequence's last token, for
    the root's children)."""
    return [root if p < 0 else tree.tokens[p] for p in tree.parents]


def graft(tree: TokenTree, root_token: int, successors, shape: Sequence[int], max_depth: int,
          max_nodes: int, eos: Sequence[int] = (), root_previous: int = -1) -> TokenTree:
    """``tree`` with the model's remembered successors added
    (``successors(token, count, previous)``: pld.successors.SuccessorTable;
    ``previous`` is the token before ``token``: the parent's, or
    ``root_previous`` for the root): every node at depth d (the root,
    ``root_token``, at 0) gets its first ``shape[d]`` successors as children
    it does not have yet (n-gram size 0, support = rank), breadth first, to
    ``max_depth`` and ``max_nodes`` in all. Nothing follows an eos node."""
    out = TokenTree(list(tree.tokens), list(tree.parents), list(tree.depths), list(tree.ngrams),
                    list(tree.supports), origins=origins_of(tree))
    eos = set(eos)
    children = {(p, t) for p, t in zip(out.parents, out.tokens)}
    queue = [(-1, root_token, 0, root_previous)] + [
        (j, t, d, above) for j, (t, d, above)
        in enumerate(zip(out.tokens, out.depths, parent_tokens(out, root_token)))]
    head = 0
    while head < len(queue) and len(out.tokens) < max_nodes:
        node, token, depth, previous = queue[head]
        head += 1
        if depth >= max_depth or depth >= len(shape) or token in eos:
            continue
        for rank, t in enumerate(successors(token, shape[depth], previous), start=1):
            if (node, t) in children or len(out.tokens) >= max_nodes:
                continue
            children.add((node, t))
            out.tokens.append(t)
            out.parents.append(node)
            out.depths.append(depth + 1)
            out.ngrams.append(0)
            out.supports.append(rank)
            out.origins.append(ROW)
            queue.append((len(out.tokens) - 1, t, depth + 1, token))
    return out


def _bucket(ngram: int, support: int, depth: int, agreement: int = UNKNOWN, origin: int = ROW
            ) -> Tuple[int, int, int, int, int]:
    d = bisect.bisect_left(DEPTH_EDGES, depth)  # the edges below depth
    return (min(ngram, NGRAM_BUCKETS - 1), min(support, SUPPORT_BUCKETS) - 1, d, agreement, origin)


class AcceptanceModel:
    """P(node accepted | parent accepted) per bucket (and origin): a
    running rate that starts from the prior, worth :data:`PRIOR_WEIGHT`
    observations. Every origin starts from the same prior and learns apart."""

    def __init__(self, prior_weight: float = PRIOR_WEIGHT, prior=PRIOR) -> None:
        self.hits: Dict[Tuple[int, int, int, int, int], float] = {}
        self.trials: Dict[Tuple[int, int, int, int, int], float] = {}
        for b in itertools.product(range(NGRAM_BUCKETS), range(SUPPORT_BUCKETS), range(len(DEPTH_EDGES) + 1),
                                   range(AGREEMENT_BUCKETS), range(ORIGINS)):
            n, s, d, a, _ = b
            self.hits[b] = min(MAX_PROBABILITY, prior[n][s][d][a]) * prior_weight
            self.trials[b] = prior_weight
        self.predicted = SCALE_WEIGHT
        self.accepted = SCALE_WEIGHT * PRIOR_SCALE

    def counts(self, origin: int = ROW) -> Tuple[Dict[Tuple[int, int, int, int], float],
                                                 Dict[Tuple[int, int, int, int], float]]:
        """(hits, trials) of ``origin``'s buckets, keyed (n-gram, support,
        depth, agreement) as the prior is laid out."""
        return ({b[:4]: v for b, v in self.hits.items() if b[4] == origin},
                {b[:4]: v for b, v in self.trials.items() if b[4] == origin})

    def add_counts(self, origin: int, hits: Dict[Tuple[int, int, int, int], float],
                   trials: Dict[Tuple[int, int, int, int], float]) -> None:
        """Add evidence gathered elsewhere (keyed as :meth:`counts` keys it)
        to ``origin``'s buckets."""
        for b4, t in trials.items():
            b = (*b4, origin)
            if b not in self.trials:
                raise ValueError(f"add_counts: no acceptance bucket {b4!r}")
            self.trials[b] += t
            self.hits[b] += hits.get(b4, 0.0)

    @property
    def scale(self) -> float:
        """Accepted nodes per predicted one, so far in this generation."""
        return self.accepted / self.predicted

    def scaled(self, reach: Sequence[float]) -> List[float]:
        """``reach`` times :attr:`scale`, capped at MAX_PROBABILITY (the
        order, and so the choice's ancestor closure, is kept)."""
        k = self.scale
        return [min(MAX_PROBABILITY, r * k) for r in reach]

    def rate(self, ngram: int, support: int, depth: int, agreement: int = UNKNOWN,
             optimism: float = 0.0, origin: int = ROW) -> float:
        """The bucket's acceptance rate (the posterior mean), plus
        ``optimism`` posterior standard deviations."""
        b = _bucket(ngram, support, depth, agreement, origin)
        n = self.trials[b]
        if not n:
            return 0.5
        mean = min(MAX_PROBABILITY, self.hits[b] / n)
        if optimism:
            mean += optimism * math.sqrt(mean * (1.0 - mean) / (n + 1.0))
        return min(MAX_PROBABILITY, mean)

    def reach(self, tree: TokenTree, optimism: float = 0.0) -> List[float]:
        """P(node reached) for every node: the product of the rates (each
        with ``optimism``, see :meth:`rate`) along its path, siblings
        scaled to share at most 1."""
        q = [self.rate(n, s, d, a, optimism, o)
             for n, s, d, a, o in zip(tree.ngrams, tree.supports, tree.depths, _agreement(tree),
                                      origins_of(tree))]
        total: Dict[int, float] = {}
        for j, parent in enumerate(tree.parents):
            total[parent] = total.get(parent, 0.0) + q[j]
        reach: List[float] = []
        for j, parent in enumerate(tree.parents):
            share = q[j] / total[parent] if total[parent] > 1.0 else q[j]
            reach.append(share * (reach[parent] if parent >= 0 else 1.0))
        return reach

    def update(self, tree: TokenTree, chosen: Sequence[int], path: Sequence[int],
               predicted: Optional[float] = None) -> None:
        """After a step: every verified node (``chosen``) whose parent was
        reached was a trial; those on the accepted ``path`` were hits.
        ``predicted`` (the chosen nodes' summed reach before scaling)
        updates :attr:`scale`."""
        if predicted is not None:
            self.predicted += predicted
            self.accepted += len(path)
        reached = {-1, *path}
        on_path = set(path)
        agreement, origins = _agreement(tree), origins_of(tree)
        for j in chosen:
            if tree.parents[j] in reached:
                b = _bucket(tree.ngrams[j], tree.supports[j], tree.depths[j], agreement[j], origins[j])
                self.trials[b] += 1.0
                if j in on_path:
                    self.hits[b] += 1.0

    def observe_chain(self, ngram: int, support: int, proposed: int, accepted: int, origin: int = ROW,
                      predicted: Optional[float] = None, count: int = 1) -> None:
        """:meth:`update` for ``count`` chains of ``proposed`` tokens of one
        bucket (n-gram, support; depth 1 upwards) of which the first
        ``accepted`` were accepted: their tokens at depths 1 .. accepted +
        1 were trials. ``predicted``: the tokens the chains were predicted
        to add, in all (for :attr:`scale`)."""
        if predicted is not None:
            self.predicted += predicted
            self.accepted += accepted * count
        for depth in range(1, min(proposed, accepted + 1) + 1):
            b = _bucket(ngram, support, depth, UNKNOWN, origin)
            self.trials[b] += count
            if depth <= accepted:
                self.hits[b] += count


def _agreement(tree: TokenTree) -> Sequence[int]:
    return tree.agreement if tree.agreement is not None else [UNKNOWN] * len(tree.tokens)


def choose_rows(reaches: Sequence[Sequence[float]], cost, pending: int, max_width: int) -> List[List[int]]:
    """The nodes to verify in one forward of every row (``reaches``: per
    row, each node's probability of being reached): every row its W
    likeliest nodes (creation order returned, so parents come first; an
    ancestor-closed set, as a child is never likelier than its parent),
    one W in [0, max_width] for all rows, the one maximising the expected
    tokens of the step over the forward's cost, ``sum over rows of (1 +
    their reach) / cost(pending + W)`` (a row with fewer nodes pads its
    block with filler)."""
    orders = [sorted(range(len(r)), key=lambda j: (-r[j], j))[:max_width] for r in reaches]
    widest = max((len(o) for o in orders), default=0)
    gained = float(len(reaches))
    best_w, best_rate = 0, gained / cost(pending)
    for w in range(1, widest + 1):
        gained += sum(r[o[w - 1]] for r, o in zip(reaches, orders) if len(o) >= w)
        rate = gained / cost(pending + w)
        if rate > best_rate:
            best_w, best_rate = w, rate
    return [sorted(o[:best_w]) for o in orders]


def merge(tree: TokenTree, other: TokenTree) -> TokenTree:
    """``tree`` with the nodes of ``other`` (same root) that it lacks: a
    node of ``other`` whose (parent, token) is in ``tree`` is that node
    (its features and origin stay ``tree``'s)."""
    out = TokenTree(list(tree.tokens), list(tree.parents), list(tree.depths), list(tree.ngrams),
                    list(tree.supports), origins=origins_of(tree))
    theirs = origins_of(other)
    where = {(p, t): j for j, (p, t) in enumerate(zip(out.parents, out.tokens))}
    mapped: List[int] = []
    for j, (t, p) in enumerate(zip(other.tokens, other.parents)):
        parent = mapped[p] if p >= 0 else -1
        key = (parent, t)
        if key not in where:
            where[key] = len(out.tokens)
            out.tokens.append(t)
            out.parents.append(parent)
            out.depths.append(other.depths[j])
            out.ngrams.append(other.ngrams[j])
            out.supports.append(other.supports[j])
            out.origins.append(theirs[j])
        mapped.append(where[key])
    return out


def is_chain(parents: Sequence[int]) -> bool:
    """Whether local ``parents`` (-1: the root) are one chain in order."""
    return all(p == i - 1 for i, p in enumerate(parents))


def local_parents(tree: TokenTree, chosen: Sequence[int]) -> List[int]:
    """For each chosen node its parent's offset in ``chosen`` (-1: the root)."""
    where = {j: i for i, j in enumerate(chosen)}
    return [where[tree.parents[j]] if tree.parents[j] >= 0 else -1 for j in chosen]


def block_visibility(parents: Sequence[int], width: int, root_valid: bool = True) -> torch.Tensor:
    """Which of a step's new tokens each new token sees: bool [1 + width,
    1 + width] for the pending token (the root; ``root_valid`` False: a
    padding token, which no token sees) and ``width`` node slots, the first
    ``len(parents)`` of them a row's chosen nodes (``parents`` local, -1:
    the root), the rest filler. A node sees the root, its ancestors and
    itself; filler sees the root and itself. (A step after the prefill has
    one pending token: the prefill of a tree is causal, pld.decoder.)"""
    seen = torch.eye(1 + width, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            seen[1 + i] |= seen[1 + parent]
    seen[:, 0] = root_valid
    return seen


def walk(tree: TokenTree, chosen: Sequence[int], pick) -> Tuple[List[int], List[int]]:
    """Acceptance from the root: ``pick(row)`` is the model's token at a
    verified row (0: the root, i + 1: chosen[i]); while it is a verified
    child of the current node, descend (to the first such child, as the C
    walk does). pld.accept_walk runs it only where a logits processor must
    see the path so far. Returns (path: offsets in
    ``chosen`` of the accepted nodes, tokens: the path's tokens and the
    model's token after it)."""
    children: Dict[Tuple[int, int], int] = {}
    for i, parent in enumerate(local_parents(tree, chosen)):
        children.setdefault((parent, tree.tokens[chosen[i]]), i)  # the first such child, as in C
    path: List[int] = []
    tokens: List[int] = []
    node = -1
    while True:
        t = pick(node + 1)
        tokens.append(t)
        nxt: Optional[int] = children.get((node, t))
        if nxt is None:
            return path, tokens
        path.append(nxt)
        node = nxt
