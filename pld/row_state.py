"""One row of a generation: its sequence, its index and what its draft
sources keep between steps."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch

from . import _core
from .config import DecodeConfig
from .draft_length import DraftLength
from .sequence_buffer import SequenceBuffer

if TYPE_CHECKING:
    from .accept_walk import UniformStream

# A row's sequence buffer starts with room for this many new tokens (plus a
# draft) and doubles as the output grows.
INITIAL_NEW_TOKENS = 1 << 10
#: The sequence's last tokens a row also keeps on the host, so that a step
#: reads them without a copy from the model's device (a wait on a GPU).
HOST_TAIL = 64


class Row:
    """Row ``batch_index`` of a generation after ``input_ids`` ([1, L], its
    padding as given: processors and criteria see the row as batched
    generate shows it). ``cur``: tokens in the sequence; ``cached``: how
    many of them the KV cache holds (all but the last after every step);
    ``previous`` / ``root``: the sequence's last two tokens as the step
    began (-1: none)."""

    def __init__(self, batch_index: int, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor],
                 config: DecodeConfig, policy: str) -> None:
        self.batch_index = batch_index
        self.prompt_len = input_ids.shape[1]
        self.buf = SequenceBuffer(input_ids, attention_mask, self.prompt_len + config.max_new_tokens,
                                  INITIAL_NEW_TOKENS + config.prompt_lookup_num_tokens + 1)
        self.cur = self.prompt_len
        self.cached = 0
        self.index = _core.NgramIndex(config.max_matching_ngram_size, config.min_ngram_size, policy)
        prompt = input_ids[0].tolist()
        self.index.extend(prompt)
        self._tail = prompt[-HOST_TAIL:]  # (the sequence's last tokens, as buf.ids holds them)
        # the tables' growth is paid here, not in a step (and with each growth of the buffer)
        self.index.reserve(self.buf.capacity - self.prompt_len)
        self.draft_length = DraftLength(config.prompt_lookup_num_tokens, config.adaptive)
        self.memory: Dict[str, Any] = {}
        # the other rows of the batch with the same prompt (the decoder sets them)
        self.siblings: List["Row"] = []
        self.previous, self.root = -1, -1
        self.scores: Optional[List[torch.Tensor]] = [] if config.output_scores else None
        self.raw: Optional[List[torch.Tensor]] = [] if config.output_logits else None
        # sampling: the row's own uniforms (pld.accept_walk; the decoder seeds them)
        self.uniforms: Optional[UniformStream] = None

    @property
    def new_count(self) -> int:
        return self.cur - self.prompt_len

    def begin_step(self, depth: int) -> None:
        """Read the sequence's last two tokens and make room for ``depth``
        draft tokens and the model's next one."""
        last = self._tail[-2:]
        self.previous, self.root = (last[0] if len(last) == 2 else -1), last[-1]
        if self.buf.ensure(self.cur + max(depth, 0) + 1):
            self.index.reserve(self.buf.capacity - self.cur)

    def pending(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids, positions, valid) [1, cur - cached] of the tokens the cache lacks."""
        a, b = self.cached, self.cur
        return self.buf.ids[:, a:b], self.buf.positions[:, a:b], self.buf.mask[:, a:b] != 0

    def ids(self, extra: int = 0) -> torch.Tensor:
        """The sequence and the ``extra`` tokens written after it ([1, cur + extra], a view)."""
        return self.buf.ids[:, :self.cur + extra]

    def write(self, tokens: Sequence[int]) -> None:
        """Put ``tokens`` after the sequence (not yet part of it: :meth:`append`)."""
        self.buf.write(self.cur, list(tokens))

    def append(self, tokens: Sequence[int]) -> None:
        """Make the first ``len(tokens)`` written tokens part of the sequence."""
        tokens = list(tokens)
        self.cur += len(tokens)
        self.index.extend(tokens)
        self.cached = self.cur - 1
        self._tail = (self._tail + tokens)[-HOST_TAIL:]

    def new_tokens(self, start: int = 0) -> List[int]:
        """The new tokens from the ``start``-th on."""
        return self.buf.ids[0, self.prompt_len + start:self.cur].tolist()

    def tail(self, n: int) -> List[int]:
        """The sequence's last ``n`` tokens (fewer if it is shorter)."""
        if n <= len(self._tail) or len(self._tail) == self.cur:
            return self._tail[-n:] if n > 0 else []
        return self.buf.ids[0, max(self.cur - n, 0):self.cur].tolist()
