"""Sibling drafts: rows of one batch with the same prompt (the samples of
``num_return_sequences``, best-of-n, a group of RL rollouts) write much of
the same text. Each row's suffix n-gram is also looked up in the tokens its
siblings have written so far (and the prompt's last tokens before them, so
the opening of a sibling's answer is found too), newest occurrences first;
the continuations join the row's tree as SIBLING nodes, which learn their
own acceptance. The drafts are a deterministic function of what the
generation wrote, so exactness holds as for any draft."""
from __future__ import annotations

from typing import List

from .. import _core
from ..token_tree import SIBLING, TokenTree, with_origin
from . import register
from .base import DraftSource, Proposal, RowView, offer

#: A row consults at most this many siblings (the next ones in batch
#: order, cyclically), so a step's lookups grow with the batch, not its square.
MAX_SIBLINGS = 8


@register("siblings", "the continuations of the row's suffix n-gram in what rows with the same prompt have written")
class Siblings(DraftSource):
    reads = writes = ("written_index", "written")

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.branches = bool(config is not None and config.draft_tree)
        self.max_n = config.max_matching_ngram_size if config is not None else 3
        self.min_n = config.min_ngram_size if config is not None else 1

    def propose(self, row: RowView, tree: TokenTree, ask: Proposal) -> TokenTree:
        if ask.depth <= 0 or not row.siblings:
            return tree
        context = row.tail(self.max_n)
        found = TokenTree([], [], [], [], [])
        for sibling in self._consulted(row):
            more = TokenTree(*self._written(sibling).propose_tree_after(
                context, ask.depth, per_ngram=ask.per_ngram, max_nodes=ask.max_nodes,
                eos_token_id=list(ask.eos) or None))
            found = offer(found, more, True)
        # for linear drafts, a sibling's continuation wins a tie with the
        # row's own: it is what the model wrote after the same words
        return offer(tree, with_origin(found, SIBLING), self.branches, wins_ties=True)

    @staticmethod
    def _consulted(row: RowView) -> List[RowView]:
        siblings = list(row.siblings)
        if len(siblings) <= MAX_SIBLINGS:
            return siblings
        after = [s for s in siblings if s.batch_index > row.batch_index]
        before = [s for s in siblings if s.batch_index < row.batch_index]
        return (after + before)[:MAX_SIBLINGS]

    def _written(self, row: RowView):
        """The row's index over its prompt's last tokens and what it has
        written, brought up to date."""
        memory = row.memory
        index = memory.get("written_index")
        if index is None:
            index = memory["written_index"] = _core.NgramIndex(self.max_n, self.min_n, "recent")
            index.extend(row.ids()[0, max(row.prompt_len - self.max_n, 0):row.prompt_len].tolist())
            memory["written"] = 0
        new = row.new_tokens(memory["written"])
        if new:
            index.extend(new)
            memory["written"] += len(new)
        return index
