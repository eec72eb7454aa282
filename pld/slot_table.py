"""Which KV-cache slots each row of a step attends to, and their positions.

The cache holds one length T for every row (pld.kv_cache.OwnedCache, or a
transformers cache with ``crop``). A step writes a block of q slots to
every row: the row's pending tokens, its chosen draft nodes, filler. A row
keeps some of them (its pending tokens and its accepted path). One row
alone gathers its kept slots to the front of the block, so the cache holds
exactly its tokens; rows of a batch keep the block up to the longest kept
extent, and what a row did not keep becomes a hole its ``valid`` entry
hides (left padding is a hole from the start). Every slot keeps the
position its token had, so a hole never shifts a position.

:class:`SlotTable` keeps ``valid`` [b, capacity] and ``positions`` [b,
capacity] with the first T slots in use; a step's block is staged after
them (the 2D mask of a forward is then a view) and kept or dropped when
the step commits. Growth doubles the capacity, so a step pays for its own
block only.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

#: Compact a batch's cache when that shortens it by more than this share
#: and it holds at least COMPACT_MIN_SLOTS slots.
COMPACT_SHARE = 0.5
COMPACT_MIN_SLOTS = 64


class SlotTable:
    """``valid`` / ``positions`` of the T slots in use for b rows, on ``device``."""

    def __init__(self, rows: int, device: torch.device, capacity: int = 256) -> None:
        self.length = 0
        self.valid = torch.zeros((rows, capacity), dtype=torch.bool, device=device)
        self.positions = torch.zeros((rows, capacity), dtype=torch.long, device=device)

    def stage(self, valid: torch.Tensor, positions: torch.Tensor) -> None:
        """Write a step's block ([b, q]) after the slots in use (not yet kept)."""
        end = self.length + valid.shape[1]
        if end > self.valid.shape[1]:
            self._grow(end)
        self.valid[:, self.length:end] = valid
        self.positions[:, self.length:end] = positions

    def keep(self, kept: Sequence[Sequence[int]], gather: bool) -> int:
        """Keep, of the staged block, each row's ``kept`` offsets
        (increasing): moved to the block's front (``gather``, one row) or
        in place, the rest of each row's kept extent becoming holes.
        Returns the slots the cache keeps of the block."""
        start = self.length
        if gather:
            (offsets,) = kept
            index = torch.tensor(list(offsets), dtype=torch.long, device=self.valid.device) + start
            m = len(offsets)
            self.valid[:, start:start + m] = self.valid[:, index]
            self.positions[:, start:start + m] = self.positions[:, index]
        else:
            m = max((o[-1] + 1 for o in kept if len(o)), default=0)
            keep = torch.zeros((self.valid.shape[0], m), dtype=torch.bool)
            for r, offsets in enumerate(kept):
                keep[r, list(offsets)] = True
            self.valid[:, start:start + m] &= keep.to(self.valid.device)
        self.length = start + m
        return m

    def select_rows(self, index: torch.Tensor) -> None:
        self.valid = self.valid[index]
        self.positions = self.positions[index]

    def compaction_index(self) -> Optional[torch.Tensor]:
        """[b, width]: each row's valid slots in order, right-aligned in
        ``width`` slots (the longest row's count; in front, masked copies
        of a row's first valid slot), when that shortens the cache by
        more than COMPACT_SHARE; else None."""
        T = self.length
        valid = self.valid[:, :T]
        counts = valid.sum(1)
        width = int(counts.max())
        if T < COMPACT_MIN_SLOTS or width >= (1 - COMPACT_SHARE) * T:
            return None
        slots = torch.arange(T, device=valid.device)[None]
        order = torch.argsort((~valid).int() * T + slots, dim=1, stable=True)[:, :width]
        j = torch.arange(width, device=valid.device)[None] - (width - counts)[:, None]
        return torch.gather(order, 1, j.clamp(min=0))

    def gather(self, index: torch.Tensor) -> None:
        """Row r's slot j becomes its old slot ``index[r, j]`` (see
        :meth:`compaction_index`); the table then holds ``width`` slots."""
        width = index.shape[1]
        counts = self.valid[:, :self.length].sum(1)
        self.positions[:, :width] = torch.gather(self.positions[:, :self.length], 1, index)
        j = torch.arange(width, device=index.device)[None]
        self.valid[:, :width] = j >= (width - counts)[:, None]
        self.length = width

    def held(self) -> List[int]:
        """Valid slots per row (the tokens each row has in the cache)."""
        return self.valid[:, :self.length].sum(1).tolist()

    def _grow(self, need: int) -> None:
        size = max(need, 2 * self.valid.shape[1])
        for name in ("valid", "positions"):
            old = getattr(self, name)
            new = torch.zeros((old.shape[0], size), dtype=old.dtype, device=old.device)
            new[:, :self.length] = old[:, :self.length]
            setattr(self, name, new)
