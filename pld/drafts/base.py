"""The interface between the step and a draft source."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple

import torch

from ..token_tree import TokenTree, merge, subtree


class RowView(Protocol):
    """What a source reads of a row (pld.row_state.Row)."""

    batch_index: int           # the row's place in the batch
    index: Any                 # the row's pld.NgramIndex over its sequence
    cur: int                   # tokens in the sequence
    prompt_len: int            # tokens of the prompt (padding included)
    siblings: Sequence[Any]    # the batch's other rows with the same prompt
    previous: int              # the sequence's second-to-last token (-1: none)
    root: int                  # the sequence's last token: the tree's root
    memory: Dict[str, Any]     # per-row state sources keep between steps (DraftSource.reads/writes)

    def ids(self, extra: int = 0) -> torch.Tensor: ...   # [1, cur + extra]: the sequence
    def tail(self, n: int) -> List[int]: ...             # the sequence's last n tokens
    def new_tokens(self, start: int = 0) -> List[int]: ...  # generated tokens from the start-th on


@dataclass(frozen=True)
class Proposal:
    """What a step asks of its sources for one row: nodes at most ``depth``
    below the root, ``max_nodes`` in the tree at most, nothing below an
    ``eos`` token; ``per_ngram``: occurrences taken of each n-gram size."""

    depth: int
    max_nodes: int
    eos: Sequence[int]
    per_ngram: int


class DraftSource:
    """A source of draft candidates. ``propose`` returns ``tree`` with the
    source's candidates added (a new tree or the same one; nodes in
    creation order, a parent before its children; the node's ``ngrams``
    entry is its match size, 0 for a model-made guess, ``supports`` its
    occurrences or rank). ``observe`` sees every verified forward of the
    row: the input token of each logits row (``inputs``), the token before
    it (``before``, -1: none) and the logits ([n, V]). A source must be a
    deterministic function of what the generation computed (no clock, no
    randomness) so that seeded sampling repeats."""

    #: whether the candidates may branch (a tree) or are one chain
    branches = True
    #: the ``row.memory`` keys the source reads, and those it writes: a key
    #: read must be written by a source of the same run (pld.drafts.build
    #: checks); no source touches keys it does not declare
    reads: Tuple[str, ...] = ()
    writes: Tuple[str, ...] = ()

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def propose(self, row: RowView, tree: TokenTree, ask: Proposal) -> TokenTree:
        return tree

    def observe(self, row: RowView, inputs: List[int], before: List[int], logits: torch.Tensor) -> None:
        return None


def empty_tree() -> TokenTree:
    return TokenTree([], [], [], [], [])


def chain(tokens: Sequence[int], ngram: int, support: int = 1,
          agreement: Optional[List[int]] = None) -> TokenTree:
    """A linear draft as a tree with one branch."""
    n = len(tokens)
    return TokenTree(list(tokens), list(range(-1, n - 1)), list(range(1, n + 1)), [ngram] * n,
                     [support] * n, agreement)


def best_chain(tree: TokenTree) -> TokenTree:
    """The path of ``tree`` that takes, from the root down, the child with
    the most support (the first made on a tie): the continuation that most
    often followed (SuffixDecoding's greedy path), as a one-branch tree with
    the nodes' features."""
    children: Dict[int, List[int]] = {}
    for j, p in enumerate(tree.parents):
        children.setdefault(p, []).append(j)
    path, node = [], -1
    while node in children:
        node = max(children[node], key=lambda j: (tree.supports[j], -j))
        path.append(node)
    return subtree(tree, path)


def offer(tree: TokenTree, found: TokenTree, branches: bool, wins_ties: bool = False,
          fallback: bool = False) -> TokenTree:
    """``found`` (a source's candidates) offered to the row's ``tree``:
    merged into it for a token tree; for linear drafts (``branches``
    False), its best chain replaces the tree's chain where that is empty
    or -- unless it is only a ``fallback`` -- was matched by a shorter
    n-gram (or an equal one: ``wins_ties``)."""
    if not len(found):
        return tree
    if branches:
        return merge(tree, found) if len(tree) else found
    best = best_chain(found)
    if not len(tree):
        return best
    if fallback:
        return tree
    if best.ngrams[0] > tree.ngrams[0] or (wins_ties and best.ngrams[0] == tree.ngrams[0]):
        return best
    return tree
