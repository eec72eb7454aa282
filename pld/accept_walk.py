"""Acceptance of one row's verified tree: walk from the root along the
model's own choices.

At each verified position the model's token is chosen as plain decoding
would choose it there -- the argmax, or a draw from the processed
distribution, the processors seeing the sequence and then the path so far
-- and while that token is a verified child of the current node the walk
descends. A chain (a linear draft) is a tree with one branch; no draft is
the root alone. Greedy thus appends plain greedy's tokens. Sampling draws
every appended token from the model's processed distribution given the
accepted prefix, one uniform from torch's generator a token (whatever the
tree, so a seed repeats a run): exact speculative sampling of a
deterministic draft.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

import torch

from . import _core
from .batch_inputs import RowOfBatch
from .token_tree import walk


@dataclass
class Walk:
    """A row's accepted ``path`` (offsets in the chosen nodes), its
    ``tokens`` (the path's and the model's next one), and for each token
    the logits position it was read at (0: the root, 1 + i: chosen[i])
    and, where processors ran, its processed scores [1, V]."""

    path: List[int]
    tokens: List[int]
    positions: List[int]
    processed: List[torch.Tensor] = field(default_factory=list)


class Picker:
    """The model's token at each verified position of one row.

    ``logits`` [1 + W, V] (row 0 the root's); ``top``: their argmax, when
    nothing needs the scores (greedy without processors); ``processors``
    (row-wise or not: ``row_wise``) see ``row``'s sequence and the path so
    far (written after it: pld.row_state.Row); ``keep_scores``: keep each
    processed row; ``sample``: draw instead of argmax."""

    def __init__(self, logits: torch.Tensor, top: Optional[List[int]], processors: Sequence[Any],
                 row_wise: bool, row: Any, sample: bool, keep_scores: bool) -> None:
        self.logits, self.top, self.processors = logits, top, processors
        self.row, self.sample, self.keep_scores = row, sample, keep_scores
        self.walked = Walk([], [], [])
        self._all = None
        self._write = bool(processors) and not row_wise  # they read the path's tokens
        if top is None and row_wise and processors:  # every row in one call
            self._all = self._process(logits.float(), 0)

    def __call__(self, position: int) -> int:
        w = self.walked
        if self.top is not None:
            token = self.top[position]
        else:
            scores = self._scores(position)
            if self.keep_scores:
                w.processed.append(scores)
            token = draw(scores) if self.sample else int(scores.argmax(dim=-1))
        if self._write:
            self.row.buf.write(self.row.cur + len(w.tokens), [token])
        w.positions.append(position)
        w.tokens.append(token)
        return token

    def _scores(self, position: int) -> torch.Tensor:
        if self._all is not None:
            return self._all[position:position + 1]
        row = self.logits[position:position + 1].float()
        return self._process(row, len(self.walked.tokens))

    def _process(self, scores: torch.Tensor, seen: int) -> torch.Tensor:
        """The processors on ``scores`` ([n, V]) of positions whose prefix
        is the sequence and the first ``seen`` path tokens (row-wise
        processors never read it, so any n)."""
        if not self.processors:
            return scores
        scores = scores.clone()  # a processor may write in place: the logits stay as they are
        ids = self.row.ids(seen)
        if scores.shape[0] > 1:
            ids = ids.expand(scores.shape[0], -1)
        r = self.row.batch_index
        for p in self.processors:
            scores = p(ids, scores, r) if isinstance(p, RowOfBatch) else p(ids, scores)
        return scores


def draw(scores: torch.Tensor) -> int:
    """One token from softmax(scores) ([1, V]), with torch's generator:
    one uniform, by inverse CDF in C on the CPU."""
    probs = torch.softmax(scores, dim=-1)
    if probs.device.type == "cpu":
        u = torch.rand(1, dtype=torch.float64).tolist()
        return _core.accept_sample([], probs.numpy(), u)[1][0]
    return int(torch.multinomial(probs, 1))


def walk_row(tree: Any, chosen: Sequence[int], picker: Picker) -> Walk:
    """The row's walk: from the root along the picker's tokens."""
    if chosen:
        path, _ = walk(tree, chosen, picker)
        picker.walked.path = path
    else:
        picker(0)
    return picker.walked
