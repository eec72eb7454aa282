"""What a generation reports: every step's record, the run's stats, the result."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from .token_tree import TokenTree


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


@dataclass
class StepRecord:
    """One verified step of one row: draft nodes verified, accepted, the
    tokens appended. ``on_step`` also gets the row's tree, the chosen
    nodes, the accepted path (node ids) and the predicted accepted count
    (these are not kept in ``stats.records``)."""

    proposed: int
    accepted: int
    tokens: List[int]
    row: int = 0
    tree: Optional[TokenTree] = field(default=None, compare=False, repr=False)
    chosen: Optional[List[int]] = field(default=None, compare=False, repr=False)
    path: Optional[List[int]] = field(default=None, compare=False, repr=False)
    predicted: float = field(default=0.0, compare=False, repr=False)


@dataclass
class LoopStats:
    """What a run of the loop cost and achieved (a batch: over its rows)."""

    steps: int = 0
    new_tokens: int = 0
    proposed_tokens: int = 0
    accepted_draft_tokens: int = 0
    forward_seconds: float = 0.0
    total_seconds: float = 0.0
    records: List[StepRecord] = field(default_factory=list)

    @property
    def tokens_per_step(self) -> float:
        return _ratio(self.new_tokens, self.steps)

    @property
    def acceptance_rate(self) -> float:
        return _ratio(self.accepted_draft_tokens, self.proposed_tokens)

    @property
    def tokens_per_second(self) -> float:
        return _ratio(self.new_tokens, self.total_seconds)

    @property
    def forward_share(self) -> float:
        return _ratio(self.forward_seconds, self.total_seconds)


@dataclass
class LoopResult:
    sequences: torch.Tensor          # [B, prompt + longest output], shorter rows padded
    stats: LoopStats
    scores: Optional[tuple] = None   # one row: processed scores, one [1, V] per new token
    logits: Optional[tuple] = None   # one row: raw logits, one [1, V] per new token
    past_key_values: Any = None
    rows: Optional[List[List[int]]] = None  # each row's new tokens
