"""The interface between the step and a draft source."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Protocol, Sequence

import torch

from ..token_tree import TokenTree


class RowView(Protocol):
    """What a source reads of a row (pld.row_state.Row)."""

    index: Any                 # the row's pld.NgramIndex over its sequence
    cur: int                   # tokens in the sequence
    previous: int              # the sequence's second-to-last token (-1: none)
    root: int                  # the sequence's last token: the tree's root
    memory: Dict[str, Any]     # per-row state sources keep between steps


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


def cut_at_eos(draft, eos) -> list:
    """``draft`` up to (without) its first eos token: nothing after an eos
    is ever generated, so it is not worth verifying."""
    eos = set(eos)
    for j, t in enumerate(draft):
        if t in eos:
            return list(draft[:j])
    return list(draft)
