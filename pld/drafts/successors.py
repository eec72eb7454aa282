"""The model's own recent guesses (pld.successors.SuccessorTable): every
verified row's likeliest next tokens are remembered after its input token
(and after its last two), and grafted into the tree after the root and
after prompt lookup's nodes where the sequence has no candidate of its own.
It also marks every node by whether the model last predicted it there (the
acceptance model's agreement buckets)."""
from __future__ import annotations

from typing import List

import torch

from ..config import MAX_TREE_WIDTH
from ..successors import SuccessorTable
from ..token_tree import TokenTree, graft, parent_tokens
from . import register
from .base import DraftSource, Proposal, RowView

#: How many of a node's remembered successors a tree offers, by the node's
#: depth (the root at 0); deeper nodes get none.
SUCCESSOR_SHAPE = (4, 2, 2, 1, 1, 1, 1, 1, 1, 1)
#: The tree may grow to this many times the step's node limit with grafts.
GRAFT_ROOM = 2


@register("successors", "the model's remembered likeliest successors of each node's token (token recycling)")
class Successors(DraftSource):
    reads = writes = ("successors",)

    def propose(self, row: RowView, tree: TokenTree, ask: Proposal) -> TokenTree:
        table = row.memory.get("successors")
        if table is None or ask.depth <= 0:
            return tree
        tree = graft(tree, row.root, table.successors, SUCCESSOR_SHAPE, ask.depth,
                     min(MAX_TREE_WIDTH, GRAFT_ROOM * ask.max_nodes), ask.eos, row.previous)
        above = parent_tokens(tree, row.root)
        tree.agreement = table.agreement(above, tree.tokens,
                                         [row.previous if p < 0 else above[p] for p in tree.parents])
        return tree

    def observe(self, row: RowView, inputs: List[int], before: List[int], logits: torch.Tensor) -> None:
        table = row.memory.get("successors")
        if table is None:
            table = row.memory["successors"] = SuccessorTable(logits.shape[-1])
        table.update(torch.tensor(inputs), logits, before)
