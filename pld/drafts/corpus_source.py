"""Corpus drafts: the row's suffix n-gram looked up in a pld.Corpus, the
sequences a user added and the outputs of earlier generations (a stream of
calls over similar inputs writes the same phrases again). Candidates from
several occurrences merge into a trie whose nodes count the occurrences
through them; they join the row's tree as CORPUS nodes, with their own
acceptance buckets by match length and count, so the width budget learns
how far to trust the corpus on this model. What the corpus held when a
step began decides its drafts; the tokens do not depend on it."""
from __future__ import annotations

from ..token_tree import CORPUS, TokenTree, with_origin
from . import register
from .base import DraftSource, Proposal, RowView, offer


@register("corpus", "the continuations of the row's suffix n-gram in a pld.Corpus (earlier outputs, added documents)")
class CorpusDrafts(DraftSource):
    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.corpus = config.corpus if config is not None else None
        self.branches = bool(config is not None and config.draft_tree)

    def propose(self, row: RowView, tree: TokenTree, ask: Proposal) -> TokenTree:
        if ask.depth <= 0 or self.corpus is None or not len(self.corpus):
            return tree
        found = TokenTree(*self.corpus.propose_tree(
            row.tail(self.corpus.max_ngram_size), ask.depth, per_ngram=ask.per_ngram, max_nodes=ask.max_nodes,
            eos_token_id=list(ask.eos) or None))
        # linear drafts learn nothing of a source's worth, and other calls'
        # text matched by a longer n-gram still misleads more often than the
        # row's own (Spec-Bench stream, qa: 1.44 -> 1.21 tokens/forward), so
        # a chain from the corpus only fills in where the row has none
        return offer(tree, with_origin(found, CORPUS), self.branches, fallback=True)
