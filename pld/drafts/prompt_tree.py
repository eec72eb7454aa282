"""Prompt lookup's candidates as a tree: several occurrences of each suffix
n-gram size, their continuations merged into a trie (NgramIndex.propose_tree;
the index keeps every occurrence: match policy "recent")."""
from __future__ import annotations

from ..token_tree import TokenTree, merge
from . import register
from .base import DraftSource, Proposal, RowView


@register("prompt_tree", "prompt lookup's candidates from several occurrences of each suffix n-gram, as a trie")
class PromptTree(DraftSource):
    def propose(self, row: RowView, tree: TokenTree, ask: Proposal) -> TokenTree:
        if ask.depth <= 0:
            return tree
        found = TokenTree.from_index(row.index, ask.depth, ask.per_ngram, ask.max_nodes, ask.eos)
        return merge(tree, found) if len(tree) else found
