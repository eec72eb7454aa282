"""A batch's inputs and outputs as batched ``model.generate`` has them:
left-padded prompts, the pad id of finished rows, and logits processors
that generate() set up for the whole batch."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

#: Warpers that treat each row on its own and never read input_ids: all of
#: a row's verified positions go through them in one call.
ROW_WISE_PROCESSORS = frozenset({
    "TemperatureLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
    "MinPLogitsWarper",
    "TypicalLogitsWarper",
    "EpsilonLogitsWarper",
    "EtaLogitsWarper",
    "LogitNormalization",
    "InfNanRemoveLogitsProcessor",
})


def check_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    """An attention mask shaped like input_ids, of 0/1 values, with a
    token attended in every row (a ValueError naming it otherwise: pld's
    loop reads a mask as attend or not, where a model may weigh another
    value in between; a row that attends nothing has no defined output,
    and models differ on what they make of it)."""
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask: expected the shape of input_ids {tuple(input_ids.shape)}, "
                         f"got {tuple(attention_mask.shape)}")
    if ((attention_mask != 0) & (attention_mask != 1)).any():
        raise ValueError("attention_mask: expected 0/1 values")
    attends_nothing = ~(attention_mask != 0).any(-1)
    if input_ids.shape[-1] and attends_nothing.any():
        rows = attends_nothing.reshape(-1).nonzero().flatten().tolist()
        raise ValueError(f"attention_mask: rows {rows} attend no token of the prompt")


def check_left_padded(input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """The batch's attention mask as a bool [B, L] tensor, checked: the
    shape of input_ids, 0/1 values, every row left-padded (no 0 after a 1)
    with at least one token."""
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids: expected shape [B, L] with B >= 1 and L >= 1, got {tuple(input_ids.shape)}")
    if attention_mask is None:
        return torch.ones(input_ids.shape, dtype=torch.bool, device=input_ids.device)
    check_mask(input_ids, attention_mask)
    mask = attention_mask.bool()
    if not mask[:, -1].all():
        rows = (~mask[:, -1]).nonzero().flatten().tolist()
        raise ValueError(f"attention_mask: rows {rows} end in padding; batched prompt lookup needs left "
                         "padding (tokenizer.padding_side = 'left')")
    if (mask[:, 1:].int() < mask[:, :-1].int()).any():
        raise ValueError("attention_mask: a row has padding between tokens; batched prompt lookup needs "
                         "left padding (tokenizer.padding_side = 'left')")
    return mask


def padded_sequences(input_ids: torch.Tensor, new: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    """[B, L + longest of ``new``]: the prompts as given, then each row's
    new tokens, the shorter ones filled with ``pad``."""
    longest = max(len(n) for n in new)
    tail = torch.full((len(new), longest), pad, dtype=torch.long, device=input_ids.device)
    for r, tokens in enumerate(new):
        if tokens:
            tail[r, :len(tokens)] = torch.tensor(list(tokens), dtype=torch.long)
    return torch.cat([input_ids, tail], dim=1)


class RowOfBatch:
    """A logits processor set up by generate() for a whole batch (say
    repetition_penalty's per-row prompt_ignore_length), called for one row:
    the row's ids and scores are repeated to the batch's size with the row
    at its own index, and its row of the output is returned. Row-wise
    processors need none of this (:func:`in_batch` leaves them be)."""

    def __init__(self, processor: Any, batch: int, row: Optional[int] = None) -> None:
        self.processor, self.batch, self.row = processor, batch, row

    def __call__(self, ids: torch.Tensor, scores: torch.Tensor, row: Optional[int] = None) -> torch.Tensor:
        """``ids`` [1, n] and ``scores`` [1, V] of row ``row`` (default: the
        row given at construction)."""
        row = self.row if row is None else row
        out = self.processor(ids.expand(self.batch, -1), scores.expand(self.batch, -1).clone())
        return out[row:row + 1]


def in_batch(processor: Any, batch: int, row: Optional[int] = None) -> Any:
    """``processor`` as it must be called one row of a ``batch`` at a time
    (``row``: always that row)."""
    if batch == 1 or type(processor).__name__ in ROW_WISE_PROCESSORS:
        return processor
    return RowOfBatch(processor, batch, row)
