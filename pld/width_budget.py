"""How many draft nodes a step verifies, and which.

Each row's candidate tree is scored by the acceptance model
(pld.token_tree.AcceptanceModel: the probability that each node is reached,
from its source, match size, support, depth and agreement, learned during
the generation from a prior). The step then verifies, in every row, the W
nodes likeliest to be reached, one W for the whole batch (a forward is
rectangular), the W that maximises the expected tokens of the step per
unit of forward cost c(P + W) (pld.forward_cost: learned from the timed
forwards of this model at this batch size and context). W = 0 (no draft)
and a single chain (a linear draft) are among the choices: a linear draft
is the case of a tree with one branch, so one budget serves linear drafts,
trees and batches.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from . import forward_cost
from .token_tree import EXPLORATION, AcceptanceModel, TokenTree, choose_rows

#: Every node pays: the cost of a step without a budget (the prefill, where
#: the forward is as wide as the prompt, and cost_aware=False).
NO_BUDGET = forward_cost.ForwardCost([1, 2], [1.0, 1.0])


#: Standard deviations of optimism for linear drafts: none. A chain's
#: buckets (by depth) learn whenever its first token is verified, so
#: exploring buys little there and verifies tokens that do not pay: on
#: held-out Spec-Bench prompts (41-45 of summarization and rag, embedded
#: model, 2 threads) the mean estimates gave 19.99 tokens/s against 18.97
#: with pld.token_tree.EXPLORATION.
CHAIN_EXPLORATION = 0.0

#: Under a learned cost (pld.forward_cost.LearnedCost), after this many
#: steps in a row that verified nothing although there were candidates, a
#: step verifies each row's likeliest node: drafts judged not to pay are
#: tried again, at the cost of one token more in a forward.
EXPLORE_EVERY = 16


class WidthBudget:
    """Chooses the nodes to verify of every row's tree, at most
    ``max_width`` a row, on rates ``exploration`` posterior standard
    deviations above the mean (pld.token_tree.EXPLORATION for trees,
    CHAIN_EXPLORATION for linear drafts)."""

    def __init__(self, max_width: int, exploration: float = EXPLORATION) -> None:
        self.max_width = max_width
        self.exploration = exploration
        self._idle = 0  # steps in a row that verified nothing although there were candidates

    def choose(self, trees: Sequence[Optional[TokenTree]], model: AcceptanceModel, cost, pending: int
               ) -> Tuple[List[List[int]], List[float]]:
        """(chosen nodes per row, creation order; the chosen nodes' summed
        reach per row at ``model``'s mean rates, unscaled) for a forward
        after ``pending`` tokens a row costing ``cost``. Chosen on hopeful
        estimates (``exploration`` standard deviations up), judged on the
        mean ones."""
        hopeful = [model.scaled(model.reach(t, self.exploration)) if t is not None else [] for t in trees]
        chosen = choose_rows(hopeful, cost, pending, self.max_width)
        if getattr(cost, "learns", False):
            chosen = self._explore(hopeful, chosen)
        return chosen, predicted(trees, chosen, model)

    def _explore(self, hopeful: Sequence[Sequence[float]], chosen: List[List[int]]) -> List[List[int]]:
        """After EXPLORE_EVERY steps in a row that verified nothing although
        there were candidates, every row verifies its likeliest node: a
        forward one token wider, so that the learned cost and the acceptance
        see drafts again when the load or the text changes."""
        if any(chosen) or not any(hopeful):
            self._idle = 0
            return chosen
        self._idle += 1
        if self._idle < EXPLORE_EVERY:
            return chosen
        self._idle = 0
        return [[max(range(len(r)), key=lambda j: (r[j], -j))] if len(r) else [] for r in hopeful]


class FirstNodes(WidthBudget):
    """The first ``max_width`` nodes of every tree in creation order
    (ancestor-closed), whatever the model or the cost: what the tree
    prior's fit verifies (pld.bench.tree_prior)."""

    def choose(self, trees: Sequence[Optional[TokenTree]], model: AcceptanceModel, cost, pending: int
               ) -> Tuple[List[List[int]], List[float]]:
        chosen = [list(range(min(len(t), self.max_width))) if t is not None else [] for t in trees]
        return chosen, predicted(trees, chosen, model)


def predicted(trees: Sequence[Optional[TokenTree]], chosen: Sequence[Sequence[int]],
              model: AcceptanceModel) -> List[float]:
    """Per row, the chosen nodes' summed reach at ``model``'s mean rates."""
    out = []
    for tree, nodes in zip(trees, chosen):
        reach = model.reach(tree) if nodes else []
        out.append(sum(reach[j] for j in nodes))
    return out
