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

It also keeps, for each pair of consecutive tokens seen as the last two
inputs of a verified row, the model's top successor there: a prediction
with one more token of context, so sharper where it exists (in the token
tree prior's fit, ``python -m pld bench tree-prior``: a 1-gram candidate
with one occurrence, at depth 1, was accepted 71% of the time where the
pair's prediction was that token, 39% where only the token's was, 4%
where the prediction was another token). Where a pair was seen, its
prediction comes first.

The table is a guess, never a decision: whatever it proposes, acceptance
walks the model's own choices (pld.accept_walk), so the tokens stay plain
decoding's. It is a function of what the generation computed so far (no
clock, no randomness), so seeded sampling repeats.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

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
        #: (previous token, token) -> the model's top successor after the two
        self.pairs: Dict[Tuple[int, int], int] = {}

    def update(self, inputs: torch.Tensor, logits: torch.Tensor,
               previous: Optional[Sequence[int]] = None) -> None:
        """Row i of ``logits`` ([n, V']) is the model's distribution after
        input token ``inputs[i]`` ([n]): remember its top k. Later rows win
        where a token repeats. Tokens or logits beyond the table's
        vocabulary are ignored. ``previous[i]``, where given (n ints; < 0:
        none), is the token before ``inputs[i]``: the pair's top successor
        is remembered too."""
        n = inputs.shape[0]
        if n == 0:
            return
        if previous is not None and len(previous) != n:
            raise ValueError("previous: expected one token per input")
        k = min(self.k, logits.shape[-1])
        top = logits.detach().topk(k, dim=-1).indices.to("cpu", torch.long)
        if previous is not None:
            vocab = self.table.shape[0]
            for p, t, s in zip(previous, inputs.tolist(), top[:, 0].tolist()):
                if 0 <= p < vocab and 0 <= t < vocab and s < vocab:
                    self.pairs[(int(p), int(t))] = int(s)
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

    def successors(self, token: int, count: int, previous: int = -1) -> List[int]:
        """The first ``count`` known successors of ``token`` (best first),
        after ``previous`` (the token before it) if that pair was seen: its
        top successor first, then the token's own, without repeats."""
        if not 0 <= token < self.table.shape[0] or count <= 0:
            return []
        out = [t for t in self.table[token].tolist() if t >= 0]
        pair = self.pairs.get((previous, token))
        if pair is not None:
            out = [pair] + [t for t in out if t != pair]
        return out[:count]

    def agreement(self, parents: Sequence[int], tokens: Sequence[int],
                  grandparents: Optional[Sequence[int]] = None) -> List[int]:
        """For each node -- its ``token``, its parent's token and the token
        before that (``grandparents``, < 0 or None: unknown) -- what the
        model last predicted after them (the buckets of
        pld.token_tree.AcceptanceModel):

        0  the pair (grandparent, parent) was seen and its top successor is ``token``;
        1  the pair was not seen, and ``token`` is the parent's top successor;
        2  it is neither (the pair's prediction, or the parent's, is another token);
        3  nothing is remembered after the parent.
        """
        if not len(tokens):
            return []
        if grandparents is None:
            grandparents = [-1] * len(tokens)
        from .token_tree import DISAGREES, PAIR_AGREES, TOKEN_AGREES, UNKNOWN

        vocab = self.table.shape[0]
        rows = torch.tensor([p if 0 <= p < vocab else 0 for p in parents], dtype=torch.long)
        tops = self.table[rows, 0].tolist()  # one gather, not one read a node
        out = []
        for g, p, t, top in zip(grandparents, parents, tokens, tops):
            pair = self.pairs.get((g, p))
            if pair is not None:
                out.append(PAIR_AGREES if pair == t else DISAGREES)
            elif not 0 <= p < vocab or top < 0:
                out.append(UNKNOWN)
            else:
                out.append(TOKEN_AGREES if top == t else DISAGREES)
        return out
