"""transformers' prompt-lookup candidate generator on pld's C index
(generate()'s ``candidate_generator`` API: ``get_candidates``)."""
from __future__ import annotations

from typing import Any, List, Optional

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from . import _core
from .config import MAX_DRAFT_TOKENS, check_size, eos_ids

# The generator reserves index room for at most this many new tokens up
# front (the index grows later as it must).
RESERVE_MAX_NEW_TOKENS = 1 << 16


class PromptLookupCandidateGenerator(CandidateGenerator):
    """transformers' prompt-lookup candidate generator, on pld's C index.

    Each call ingests only the tokens appended since the previous call (for
    a GPU ``input_ids`` only that tail is copied to the host), so a call
    costs the same at any context length. With ``policy="first"`` it
    proposes what transformers' own generator proposes; one difference:
    when logits processors forbid the draft's first token, transformers
    tries a later occurrence and this generator proposes nothing.
    """

    requires_model_outputs = False

    def __init__(
        self,
        eos_token_id: Any = None,
        num_output_tokens: int = 10,
        max_matching_ngram_size: int = 2,
        max_length: int = 20,
        logits_processor: Any = None,
        vocab_size: Optional[int] = None,
        *,
        min_ngram_size: int = 1,
        policy: str = "first",
    ) -> None:
        if max_matching_ngram_size is None or max_matching_ngram_size <= 0 or num_output_tokens <= 0:
            raise ValueError("Invalid max_matching_ngram_size or num_output_tokens")
        check_size("num_output_tokens (prompt_lookup_num_tokens)", num_output_tokens, 1,
                   MAX_DRAFT_TOKENS, "the C core's limit on a draft")
        self.num_output_tokens = num_output_tokens
        self.max_matching_ngram_size = max_matching_ngram_size
        self.max_length = max_length
        self.eos_token_id = eos_token_id
        self.logits_processor = logits_processor
        self.vocab_size = vocab_size
        self._eos = list(eos_ids(eos_token_id))
        self.index = _core.NgramIndex(max_matching_ngram_size, min_ngram_size, policy)
        self._seen = 0

    def _ingest(self, input_ids: torch.Tensor) -> None:
        length = input_ids.shape[1]
        if length < self._seen:  # a different (shorter) sequence: start over
            self.index.truncate(0)
            self._seen = 0
        if length > self._seen:
            if self._seen == 0:  # a new prompt: the tables grow here, not per step
                self.index.reserve(min(max(self.max_length - length, 0), RESERVE_MAX_NEW_TOKENS))
            self.index.extend(input_ids[0, self._seen:].tolist())
            self._seen = length

    def get_candidates(self, input_ids: torch.LongTensor, *args: Any, **kwargs: Any):
        if input_ids.shape[0] != 1:
            raise ValueError("prompt lookup supports batch size 1 only")
        self._ingest(input_ids)
        draft = self.index.propose(
            self.num_output_tokens, semantics="transformers",
            max_length=self.max_length, eos_token_id=self._eos or None)
        if draft and self.logits_processor is not None and len(self.logits_processor) > 0:
            draft = self._cut_forbidden(input_ids, draft)
        if not draft:
            return input_ids, None
        tail = torch.tensor([draft], dtype=input_ids.dtype, device=input_ids.device)
        return torch.cat((input_ids, tail), dim=1), None

    def _cut_forbidden(self, input_ids: torch.Tensor, draft: List[int]) -> List[int]:
        """Cut the draft before the first token the processors forbid."""
        fake = torch.ones((1, self.vocab_size), device=input_ids.device, dtype=torch.float32)
        draft_t = torch.tensor([draft], dtype=input_ids.dtype, device=input_ids.device)
        lowest = torch.finfo(torch.float32).min
        for i, token in enumerate(draft):
            ids = input_ids if i == 0 else torch.cat((input_ids, draft_t[:, :i]), dim=1)
            value = self.logits_processor(ids, fake.clone())[0, token]
            if value == -float("inf") or value == lowest:
                return draft[:i]
        return draft

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor,
                                  num_matches: int) -> None:
        return None  # the draft length is fixed by prompt_lookup_num_tokens
