"""Guesses ahead: the model's remembered successors of the sequence's last
token that prompt lookup did not propose, each followed by prompt lookup's
candidates for the sequence as if the guess came next (the index extended
by it, then cut back): a seam the input cannot predict, then a copy it can.
Reads the "successors" source's table (``reads``: a run without that source is refused)."""
from __future__ import annotations

from ..token_tree import TokenTree, with_subtree
from . import register
from .base import DraftSource, Proposal, RowView, empty_tree

#: Remembered successors of the root each followed by prompt lookup's candidates.
ROOT_GUESSES = 2


@register("ahead", "the model's likeliest next tokens after the root, each followed by prompt lookup's "
          "candidates as if it came next")
class GuessesAhead(DraftSource):
    reads = ("successors",)

    def propose(self, row: RowView, tree: TokenTree, ask: Proposal) -> TokenTree:
        table = row.memory.get("successors")
        if table is None:
            return tree
        have = {t for t, p in zip(tree.tokens, tree.parents) if p < 0}
        eos = set(ask.eos)
        for rank, s in enumerate(table.successors(row.root, ROOT_GUESSES, row.previous), start=1):
            if s in have or s in eos or len(tree) >= ask.max_nodes:
                continue
            tree = with_subtree(tree, s, 0, rank, self._below(row, s, ask))
        return tree

    @staticmethod
    def _below(row: RowView, guess: int, ask: Proposal) -> TokenTree:
        if ask.depth <= 1:
            return empty_tree()
        row.index.extend(guess)
        try:
            return TokenTree.from_index(row.index, ask.depth - 1, ask.per_ngram, ask.max_nodes, ask.eos)
        finally:
            row.index.truncate(row.cur)
