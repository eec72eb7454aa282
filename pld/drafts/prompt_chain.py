"""Prompt lookup's draft: the continuation after the match of the
sequence's suffix n-gram (the index's match policy: by default the
method's earliest occurrence), one chain a step."""
from __future__ import annotations

from ..config import eos_at
from ..token_tree import TokenTree
from . import register
from .base import DraftSource, Proposal, RowView, chain


@register("prompt", "prompt lookup's linear draft: the continuation after the suffix n-gram's match")
class PromptChain(DraftSource):
    branches = False

    def propose(self, row: RowView, tree: TokenTree, ask: Proposal) -> TokenTree:
        if len(tree) or ask.depth <= 0:
            return tree
        draft = row.index.propose(ask.depth, semantics=self.config.semantics if self.config else "seed")
        if not len(draft):
            return tree
        ngram = row.index.last_ngram
        draft = draft[:eos_at(draft, ask.eos)]
        return chain(draft, ngram) if len(draft) else tree

