"""Acceptance of one row's verified tree: walk from the root along the
model's own choices, in C (pld.accept_greedy, pld.accept_sample).

At each verified position the model's token is chosen as plain decoding
would choose it there -- the argmax, or a draw from the processed
distribution -- and while that token is a child of the current node the
walk descends (the first such child). A chain (a linear draft) is a tree
with one branch; no draft is the root alone. Greedy thus appends plain
greedy's tokens, and draws nothing from any generator.

Sampling gives each row its own stream of uniforms (:class:`UniformStream`:
a private generator, seeded once from torch's default generator as the run
begins) and takes 1 + depth of them a step (depth: the deepest chosen
node's, 0 for no draft); the token at a position of depth d is the
inverse-CDF draw from its distribution with the d-th: one uniform a token
along any path, so every appended token is an independent draw from the
model's processed distribution given the accepted prefix -- exact
speculative sampling of a deterministic draft. The stream then moves on by
one uniform a token the walk drew (:class:`Uniforms`), so the uniforms a
row did not reach serve its next tokens: the j-th token a row draws takes
the j-th uniform of its stream, whatever depth was verified in that row or
any other -- and the width budget, which picks depths from measured times,
cannot change a seeded run. torch's default generator advances by the
seeds alone (one draw a row), whatever the run drafted or accepted.

Where the processors act on each row as a whole (pld.batch_inputs.
ROW_WISE_PROCESSORS, or none), a row's positions are processed in one call
and the walk runs in C (:func:`from_scores`; off the CPU the draws are made
on the device and C walks along them). Where a processor must see the path
so far, Python walks (:class:`Picker`, pld.token_tree.walk), writing each
chosen token after the row's sequence before the next position is
processed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

import torch

from . import _core
from .batch_inputs import RowOfBatch
from .token_tree import walk


@dataclass
class Walk:
    """A row's accepted ``path`` (offsets in the chosen nodes), its
    ``tokens`` (the path's and the model's next one), and for each token
    the logits position it was read at (0: the root, 1 + i: chosen[i])
    and, where processors ran or scores are kept, its processed scores
    [1, V]."""

    path: List[int]
    tokens: List[int]
    positions: List[int]
    processed: List[torch.Tensor] = field(default_factory=list)


def positions(path: Sequence[int]) -> List[int]:
    """The logits positions a walk along ``path`` read: the root's, then each node's."""
    return [0] + [1 + p for p in path]


def greedy(nodes: Sequence[int], parents: Sequence[int], choices: Sequence[int]) -> Walk:
    """The walk along ``choices`` (the argmax at the 1 + len(nodes) positions), in C."""
    path, tokens = _core.accept_greedy(nodes, choices, parents)
    return Walk(path, tokens, positions(path))


class UniformStream:
    """A row's uniforms in [0, 1), float64, in order: a private CPU
    generator seeded with ``seed`` (see the module); :meth:`peek` and
    :meth:`drop` read and consume them. Nothing else draws from it."""

    CHUNK = 64  # uniforms drawn at a time

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.ahead = torch.empty(0, dtype=torch.float64)

    @staticmethod
    def seeds(n: int) -> List[int]:
        """``n`` seeds from torch's default generator, one draw for all:
        what a sampling run takes from it."""
        return torch.randint(0, 1 << 62, (n,), dtype=torch.int64).tolist()

    def peek(self, n: int) -> torch.Tensor:
        """The next ``n`` uniforms, left in the stream."""
        if self.ahead.numel() < n:
            more = torch.rand(max(n - self.ahead.numel(), self.CHUNK), generator=self.generator,
                              dtype=torch.float64)
            self.ahead = torch.cat([self.ahead, more])
        return self.ahead[:n]

    def drop(self, n: int) -> None:
        """Consume the next ``n`` uniforms."""
        self.peek(n)
        self.ahead = self.ahead[n:]


class Uniforms:
    """A row's uniforms for a step: ``u``, 1 + its deepest node's depth
    (``depths``: its chosen nodes'), the next of its ``stream``;
    :meth:`spend` then consumes only the uniforms of the tokens drawn."""

    def __init__(self, depths: Sequence[int], stream: UniformStream) -> None:
        self.stream = stream
        self.u = stream.peek(1 + max(depths, default=0))

    def spend(self, drawn: int) -> None:
        """Consume ``drawn`` uniforms: the next step starts after them."""
        self.stream.drop(drawn)


def process(scores: torch.Tensor, processors: Sequence[Any], row: Any, seen: int) -> torch.Tensor:
    """The processors on ``scores`` ([n, V]) of positions whose prefix is
    ``row``'s sequence and the first ``seen`` path tokens (row-wise
    processors never read it, so any n)."""
    if not processors:
        return scores
    scores = scores.clone()  # a processor may write in place: the logits stay as they are
    ids = row.ids(seen)
    if scores.shape[0] > 1:
        ids = ids.expand(scores.shape[0], -1)
    r = row.batch_index
    for p in processors:
        out = p(ids, scores, r) if isinstance(p, RowOfBatch) else p(ids, scores)
        if not isinstance(out, torch.Tensor) or out.shape != scores.shape:
            got = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise TypeError(f"logits_processor: {type(getattr(p, 'processor', p)).__name__} returned {got}; "
                            f"expected the scores, a tensor of shape {tuple(scores.shape)}")
        scores = out
    return scores


def from_scores(scores: torch.Tensor, nodes: Sequence[int], parents: Sequence[int], depths: Sequence[int],
                u: Optional[Uniforms], keep_scores: bool) -> Walk:
    """The walk over a row's processed ``scores`` ([1 + len(nodes), V]):
    argmax (``u`` None) or draws with ``u`` (see the module), in C."""
    if u is None:
        path, tokens = _core.accept_greedy(nodes, scores.argmax(dim=-1).tolist(), parents)
    else:
        probs = torch.softmax(scores, dim=-1)
        if draws_on_host(probs):
            path, tokens = _sample_on_host(nodes, probs, u.u.tolist(), parents)
        else:
            path, tokens = _core.accept_greedy(nodes, draws(probs, u.u, [0] + list(depths)), parents)
            _check_drawn(tokens[-1])
        u.spend(len(tokens))
    walked = Walk(path, tokens, positions(path))
    if keep_scores:
        walked.processed = [scores[p:p + 1] for p in walked.positions]
    return walked


def draws_on_host(probs: torch.Tensor) -> bool:
    """Whether ``probs`` are drawn from in C, on the host: on the CPU, and
    on a device when torch's deterministic mode is on
    (``torch.use_deterministic_algorithms``), where the device draw's
    floating-point ``cumsum`` raises a RuntimeError. Both draw the same
    tokens."""
    return probs.device.type == "cpu" or torch.are_deterministic_algorithms_enabled()


def draws(probs: torch.Tensor, u: torch.Tensor, depths: Sequence[int]) -> List[int]:
    """The inverse-CDF draw at each row of ``probs`` ([n, V], any device),
    row p with u[depths[p]]: the least v whose cumulative mass exceeds u
    times the row's (as the C core draws); -1 for a row that is not a
    distribution (NaN, infinite or no mass)."""
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1:]
    target = u.to(probs.device)[torch.tensor(list(depths), device=probs.device)][:, None] * total
    chosen = torch.searchsorted(cdf, target, right=True).clamp_(max=probs.shape[-1] - 1)[:, 0]
    ok = torch.isfinite(total[:, 0]) & (total[:, 0] > 0) & (probs >= 0).all(dim=-1)
    return torch.where(ok, chosen, torch.full_like(chosen, -1)).tolist()


#: Why a draw failed, in the caller's terms (the C core names its argument, probs).
_NO_MASS = ("logits_processor/temperature/top_k/top_p: the processed scores of a new token leave no "
            "probability to sample from (every score -inf, or one NaN or +inf)")


def _check_drawn(token: int) -> None:
    if token < 0:
        raise ValueError(_NO_MASS)


def _sample_on_host(nodes: Sequence[int], probs: torch.Tensor, u: Sequence[float],
                    parents: Optional[Sequence[int]] = None) -> Tuple[List[int], List[int]]:
    """_core.accept_sample on ``probs`` (on the host), its refusal of a
    row that is not a distribution said in the caller's terms."""
    try:
        return _core.accept_sample(nodes, probs.cpu().numpy(), u, parents)
    except ValueError as error:
        if str(error).startswith("probs: every row"):
            raise ValueError(_NO_MASS) from error
        raise


def draw(scores: torch.Tensor, u: float) -> int:
    """One token from softmax(scores) ([1, V]) with the uniform ``u``, by
    inverse CDF (in C on the CPU)."""
    probs = torch.softmax(scores, dim=-1)
    if draws_on_host(probs):
        return _sample_on_host([], probs, [u])[1][0]
    token = draws(probs, torch.tensor([u], dtype=torch.float64), [0])[0]
    _check_drawn(token)
    return token


class Picker:
    """The model's token at each verified position of one row, one position
    at a time, for processors that must see the path so far.

    ``logits`` [1 + W, V] (row 0 the root's); ``processors`` see ``row``'s
    sequence and the path so far (written after it: pld.row_state.Row);
    ``u``: the row's uniforms (None: argmax), the token at depth d drawn
    with u.u[d]; ``keep_scores``: keep each processed row."""

    def __init__(self, logits: torch.Tensor, processors: Sequence[Any], row: Any, u: Optional[Uniforms],
                 keep_scores: bool) -> None:
        self.logits, self.processors, self.row, self.keep_scores = logits, processors, row, keep_scores
        self.uniforms = u
        self.u = None if u is None else u.u.tolist()
        self.walked = Walk([], [], [])

    def __call__(self, position: int) -> int:
        w = self.walked
        depth = len(w.tokens)  # a walk reads one position a depth
        scores = process(self.logits[position:position + 1].float(), self.processors, self.row, depth)
        if self.keep_scores:
            w.processed.append(scores)
        token = int(scores.argmax(dim=-1)) if self.u is None else draw(scores, self.u[depth])
        self.row.buf.write(self.row.cur + depth, [token])
        w.positions.append(position)
        w.tokens.append(token)
        return token


def walk_row(tree: Any, chosen: Sequence[int], picker: Picker) -> Walk:
    """The row's walk in Python: from the root along the picker's tokens."""
    if chosen:
        path, _ = walk(tree, chosen, picker)
        picker.walked.path = path
    else:
        picker(0)
    if picker.uniforms is not None:
        picker.uniforms.spend(len(picker.walked.tokens))
    return picker.walked
