"""The model's own recent guesses of what follows a token: draft candidates
beyond the input.

Prompt lookup drafts only what the sequence already contains. Every
verified forward, though, computes the model's distribution at every row it
verifies -- the accepted ones and the rejected branches alike -- and only
the sampled or argmax token of one row is used. :class:`SuccessorTable`
keeps, for each token, the k likeliest next tokens at the row where that
token was last an input (the "token recycling" idea: Luo et al. 2024,
an adjacency matrix of top-k successors refreshed from every forward). A
tree step then offers them as extra candidates (pld.token_tree.graft):
after the root, and after nodes prompt lookup proposes, where the sequence
has no candidate of its own.

The table is a guess, never a decision: whatever it proposes, acceptance
walks the model's own choices (pld.tree_decoder), so the tokens stay plain
decoding's. It is a function of what the generation computed so far (no
clock, no randomness), so seeded sampling repeats.
"""
from __future__ import annotations

from typing import List, Sequence

import torch

#: Successors kept per token.
SUCCESSORS = 4


class SuccessorTable:
    """For each of ``vocab_size`` tokens its ``k`` likeliest successors
    (best first) as last seen, -1 where never seen. Lives on the CPU."""

    def __init__(self, vocab_size: int, k: int = SUCCESSORS) -> None:
        if vocab_size < 1 or k < 1:
            raise ValueError("vocab_size and k must be positive")
        self.k = int(k)
        self.table = torch.full((int(vocab_size), self.k), -1, dtype=torch.long)

    def update(self, inputs: torch.Tensor, logits: torch.Tensor) -> None:
        """Row i of ``logits`` ([n, V']) is the model's distribution after
        input token ``inputs[i]`` ([n]): remember its top k. Later rows win
        where a token repeats. Tokens or logits beyond the table's
        vocabulary are ignored."""
        n = inputs.shape[0]
        if n == 0:
            return
        k = min(self.k, logits.shape[-1])
        top = logits.detach().topk(k, dim=-1).indices.to("cpu", torch.long)
        inputs = inputs.to("cpu", torch.long)
        ok = (inputs >= 0) & (inputs < self.table.shape[0])
        if not bool(ok.all()):
            inputs, top = inputs[ok], top[ok]
        top = top.masked_fill(top >= self.table.shape[0], -1)
        # index_copy_ with repeated indices keeps an unspecified one: take the
        # last occurrence of each token explicitly.
        last = {int(t): i for i, t in enumerate(inputs.tolist())}
        rows = torch.tensor(list(last.values()), dtype=torch.long)
        self.table[torch.tensor(list(last.keys()), dtype=torch.long), :k] = top[rows]

    def successors(self, token: int, count: int) -> List[int]:
        """The first ``count`` known successors of ``token`` (best first)."""
        if not 0 <= token < self.table.shape[0]:
            return []
        out = self.table[token, :count].tolist()
        return [t for t in out if t >= 0]

    def agreement(self, parents: Sequence[int], tokens: Sequence[int]) -> List[int]:
        """For each (parent token, token) pair: 0 if ``token`` is the
        parent's top remembered successor, 1 if another kept one, 2 if none
        of them, 3 if nothing is remembered after the parent (the buckets
        of pld.token_tree.AcceptanceModel)."""
        if not len(tokens):
            return []
        parents_t = torch.tensor(list(parents), dtype=torch.long)
        tokens_t = torch.tensor(list(tokens), dtype=torch.long)
        known = (parents_t >= 0) & (parents_t < self.table.shape[0])
        rows = self.table[parents_t.clamp(0, self.table.shape[0] - 1)]
        rows[~known] = -1
        hit = rows == tokens_t[:, None]
        out = torch.where(hit[:, 0], 0, torch.where(hit.any(dim=1), 1, 2))
        out[rows[:, 0] < 0] = 3
        return out.tolist()
