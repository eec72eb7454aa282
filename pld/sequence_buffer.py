"""The sequence a generation writes: token ids, attention mask and position
ids in device buffers that grow with the output.

The buffers start with room for the prompt, ``initial_new`` new tokens and
one draft, and double when the output needs more, up to prompt +
max_new_tokens: memory follows the output, not the budget. Stopping
criteria and logits processors see the ids as views.
"""
from __future__ import annotations

from typing import Optional

import torch


class SequenceBuffer:
    """ids [1, capacity], mask [1, capacity], positions [1, capacity].

    Positions follow the prompt's attention mask as transformers counts
    them: attended tokens count from 0, padding gets 1; new tokens continue
    after the last prompt position.
    """

    def __init__(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor],
                 limit: int, initial_new: int) -> None:
        prompt_len = input_ids.shape[1]
        device = input_ids.device
        self.prompt_len = prompt_len
        self.limit = limit  # the most tokens it will ever hold
        self.capacity = min(limit, prompt_len + initial_new)
        self.ids = torch.empty((1, self.capacity), dtype=torch.long, device=device)
        self.ids[:, :prompt_len] = input_ids
        if attention_mask is not None:
            if attention_mask.shape != input_ids.shape:
                raise ValueError("attention_mask: expected the shape of input_ids")
            self.mask = torch.ones((1, self.capacity), dtype=attention_mask.dtype, device=device)
            self.mask[:, :prompt_len] = attention_mask
            self.n_pad = int((attention_mask == 0).sum())
        else:
            self.mask = torch.ones((1, self.capacity), dtype=torch.long, device=device)
            self.n_pad = 0
        prompt_positions = self.mask[:, :prompt_len].long().cumsum(-1) - 1
        prompt_positions.masked_fill_(self.mask[:, :prompt_len] == 0, 1)
        tail = torch.arange(prompt_len - self.n_pad, self.capacity - self.n_pad, device=device)
        self.positions = torch.cat([prompt_positions, tail[None]], dim=1)

    def ensure(self, size: int) -> bool:
        """Room for ``size`` tokens (at most the limit); True if it grew."""
        if size <= self.capacity:
            return False
        old = self.capacity
        self.capacity = min(self.limit, max(size, 2 * old))
        device = self.ids.device
        ids = torch.empty((1, self.capacity), dtype=self.ids.dtype, device=device)
        ids[:, :old] = self.ids
        mask = torch.ones((1, self.capacity), dtype=self.mask.dtype, device=device)
        mask[:, :old] = self.mask
        tail = torch.arange(old - self.n_pad, self.capacity - self.n_pad,
                            dtype=self.positions.dtype, device=device)
        self.ids, self.mask = ids, mask
        self.positions = torch.cat([self.positions, tail[None]], dim=1)
        return True

    def write(self, at: int, tokens) -> None:
        """ids[at:at + len(tokens)] = tokens (a list of ints)."""
        if len(tokens):
            self.ids[0, at:at + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
