"""One prompt-lookup generation with token-tree drafts.

:class:`TreeDecoder` is :class:`~pld.decoder.Decoder` with its step's
first three phases widened from one draft to a tree of them:

    propose  tree = index.propose_tree(k)      C: candidate continuations
             (several occurrences of each suffix n-gram) merged into a trie;
             with tree_successors, the model's remembered successors grafted
             on (pld.successors), the root's best guesses each followed by
             the index's candidates as if the guess came next; the nodes
             worth verifying chosen under the width budget
             (pld.token_tree.choose, from pld.forward_cost's measured c(w))
    verify   logits = model([pending..., *nodes])   one forward; node i at
             position last + depth(i), seeing the context, its ancestors
             and itself (a 4D attention mask)
    accept   walk from the root: the model's token at the current node's row
             (argmax, or a draw from the processed distribution); while it
             is a verified child, descend
    commit   as for a linear draft, the cache keeping the context and the
             accepted path (OwnedCache.keep_last: a gather, not a crop);
             every verified row's top successors remembered (after its
             input token, and after its last two)

Exactness: greedy appends the model's argmax at every row it reads, each
row computed with exactly the accepted prefix in view, so the tokens are
plain greedy decoding's. Sampling draws every appended token from the
model's processed distribution given the accepted prefix (the tree only
decides which rows were computed ahead), so the output has the model's
distribution; draws use torch's generator, so a seed repeats a run. The
budget's choices never read the clock within a generation: c(w) is
measured before the first drafted step and frozen; the successors are a
function of what the generation computed, so they too repeat.
"""
from __future__ import annotations

import time
from typing import Any, List, Optional, Sequence, Tuple

import torch

from . import _core, forward_cost
from .config import MAX_TREE_WIDTH
from .decoder import Decoder
from .successors import SuccessorTable
from .token_tree import (EXPLORATION, AcceptanceModel, TokenTree, choose, graft, local_parents,
                         parent_tokens, tree_visibility, walk, with_subtree)

#: How many of a node's remembered successors a tree offers, by the node's
#: depth (the root at 0); deeper nodes get none.
SUCCESSOR_SHAPE = (4, 2, 2, 1, 1, 1, 1, 1, 1, 1)
#: Remembered successors of the root each followed by prompt lookup's
#: candidates after it (TreeDecoder.guess_ahead).
ROOT_GUESSES = 2


class TreeDecoder(Decoder):
    """A :class:`~pld.decoder.Decoder` whose steps verify token trees.
    The adapter's cache must offer ``keep_last`` (pld.kv_cache.OwnedCache)."""

    INDEX_POLICY = "recent"  # the index keeps every occurrence's chain

    def __init__(self, model: Any, input_ids: torch.Tensor, config, **kwargs: Any) -> None:
        super().__init__(model, input_ids, config, **kwargs)
        self.gate = None  # the width budget decides
        self.acceptance = AcceptanceModel()
        self.cost: Optional[forward_cost.ForwardCost] = None
        self._eos_list = sorted(self.eos)
        self._tree: Optional[TokenTree] = None
        self._chosen: List[int] = []
        self._predicted = 0.0
        self._tail = (-1, -1)  # the sequence's last two tokens, read at each step's start
        self.successors: Optional[SuccessorTable] = None  # made at the first logits

    def step(self) -> bool:
        """One step: propose a tree, verify it, walk it, commit the path."""
        self._tail = self._last_two()  # read once: propose and remember use it
        tree, chosen = self.propose_tree()
        logits = self.verify_tree(tree, chosen)
        path, new, processed, rows, seconds = self.accept_tree(tree, chosen, logits)
        self.remember(tree, chosen, logits)
        self._tree, self._chosen, self._path = tree, chosen, path
        self.commit(len(chosen), 0, len(path), new, processed, rows, seconds)
        return not self.done

    # -- propose -----------------------------------------------------------
    def propose_tree(self) -> Tuple[Optional[TokenTree], List[int]]:
        """The trie of candidates and the nodes of it to verify (creation
        order); (None, []) for a step without a draft."""
        budget = self.config.max_new_tokens - (self.cur - self.buf.prompt_len)
        depth = min(self.config.num_pred_tokens, budget - 1)
        if self.buf.ensure(self.cur + max(depth, 0) + 1):
            self.index.reserve(self.buf.capacity - self.cur)
        if depth <= 0:
            return None, []
        if self.model.cached == 0 or not self.config.cost_aware:
            # The prefill's forward is as wide as the prompt: a tree adds
            # little to it, so its nodes go in without a budget (and
            # cost_aware=False verifies every node up to tree_width).
            cost = _NO_BUDGET
        else:
            if self.cost is None:
                self.cost = self.calibrate()
            cost = self.cost
        width = self.config.tree_width
        max_nodes = min(MAX_TREE_WIDTH, 2 * width)
        tree = TokenTree.from_index(self.index, depth, self.config.tree_candidates, max_nodes,
                                    self._eos_list)
        if self.successors is not None:
            previous, root = self._tail
            tree = self.guess_ahead(tree, root, depth, max_nodes, previous)
            tree = graft(tree, root, self.successors.successors, SUCCESSOR_SHAPE, depth,
                         min(MAX_TREE_WIDTH, 4 * width), self._eos_list, previous)
            above = parent_tokens(tree, root)
            tree.agreement = self.successors.agreement(
                above, tree.tokens, [previous if p < 0 else above[p] for p in tree.parents])
        if not len(tree):
            return None, []
        pending = self.cur - self.model.cached
        # chosen on hopeful estimates (EXPLORATION), judged on the mean ones
        hopeful = self.acceptance.reach(tree, EXPLORATION)
        chosen = choose(self.acceptance.scaled(hopeful), cost, pending, width)
        reach = self.acceptance.reach(tree)
        self._predicted = sum(reach[j] for j in chosen)
        return tree, chosen

    def _last_two(self) -> Tuple[int, int]:
        """The sequence's last two tokens (-1 for a missing one)."""
        last = self.buf.ids[0, max(self.cur - 2, 0):self.cur].tolist()
        return (last[0] if len(last) == 2 else -1), last[-1]

    def guess_ahead(self, tree: TokenTree, root: int, depth: int, max_nodes: int,
                    previous: int = -1) -> TokenTree:
        """The root's (``root``: the sequence's last token, after
        ``previous``) remembered successors that prompt lookup did not
        propose, each followed by prompt lookup's candidates for the
        sequence as if it came next (the index extended by it, then cut
        back): a seam the input cannot predict, then a copy it can."""
        have = {t for t, p in zip(tree.tokens, tree.parents) if p < 0}
        for rank, s in enumerate(self.successors.successors(root, ROOT_GUESSES, previous), start=1):
            if s in have or s in self.eos or len(tree) >= max_nodes:
                continue
            below = TokenTree([], [], [], [], [])
            if depth > 1:
                self.index.extend(s)
                try:
                    below = TokenTree.from_index(self.index, depth - 1, self.config.tree_candidates,
                                                 max_nodes, self._eos_list)
                finally:
                    self.index.truncate(self.cur)
            tree = with_subtree(tree, s, 0, rank, below)
        return tree

    def calibrate(self) -> forward_cost.ForwardCost:
        """c(w) for this model at this context (measured once per context
        size class and kept for the model)."""
        adapter, buf = self.model, self.buf
        a, cur = adapter.cached, self.cur
        pending = cur - a
        dtype = adapter.dtype
        top = min(MAX_TREE_WIDTH, self.config.tree_width) + pending
        widths = [w for w in forward_cost.WIDTHS if pending <= w < top] + [top]
        if widths[0] != 1:
            widths = [1] + widths

        def probe(w: int) -> None:
            nodes = max(w - pending, 0)
            chain = list(range(-1, nodes - 1))
            ids = torch.cat([buf.ids[:, a:cur], buf.ids[:, cur - 1:cur].expand(1, nodes)], dim=1)
            depths = torch.arange(1, nodes + 1, device=buf.positions.device)
            adapter.forward(ids, *self._tree_inputs(chain, depths), 1)
            adapter.truncate_cache(a)

        key = (forward_cost.size_class(cur), str(dtype), buf.ids.device.type,
               self.config.linear_kernel, pending)
        with torch.no_grad():
            # the prefill was a forward over the prompt: if it was as wide as
            # the widest probe, the allocations are made
            return forward_cost.cached_or_measure(adapter.model, key, probe, widths,
                                                  warm_up=buf.prompt_len < top)

    def remember(self, tree: Optional[TokenTree], chosen: Sequence[int], logits: torch.Tensor) -> None:
        """Keep each verified row's likeliest successors (tree_successors)."""
        if not self.config.tree_successors:
            return
        if self.successors is None:
            self.successors = SuccessorTable(logits.shape[-1])
        # row 0's input is the sequence's last token; a node's row follows
        # the node after its parent's token (the root's for the root's children)
        previous, root = self._tail
        inputs, before = [root], [previous]
        if chosen:
            above = parent_tokens(tree, root)
            inputs += [tree.tokens[j] for j in chosen]
            before += [above[j] for j in chosen]
        self.successors.update(torch.tensor(inputs), logits, before)

    # -- verify ------------------------------------------------------------
    def verify_tree(self, tree: Optional[TokenTree], chosen: Sequence[int]) -> torch.Tensor:
        """Logits [1 + W, V]: the root's row (the last pending token), then
        one row per chosen node."""
        if not chosen:
            return self.verify(0)
        buf = self.buf
        device = buf.ids.device
        tokens = torch.tensor([tree.tokens[j] for j in chosen], dtype=torch.long, device=device)
        depths = torch.tensor([tree.depths[j] for j in chosen], dtype=buf.positions.dtype,
                              device=device)
        ids = torch.cat([buf.ids[:, self.model.cached:self.cur], tokens[None]], dim=1)
        positions, mask = self._tree_inputs(local_parents(tree, chosen), depths)
        self._t_forward = time.perf_counter()
        return self.model.forward(ids, positions, mask, len(chosen) + 1)

    def _tree_inputs(self, parents: Sequence[int], depths: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        """(positions [1, pending + W], the attention mask(s)) of a forward
        over the pending tokens and W nodes (``parents`` local, -1: the
        root; ``depths`` from 1) after the cached context."""
        buf = self.buf
        a, cur = self.model.cached, self.cur
        nodes = buf.positions[:, cur - 1:cur] + depths[None]
        positions = torch.cat([buf.positions[:, a:cur], nodes], dim=1)
        allowed = tree_visibility(buf.mask[0, :cur].cpu(), a, cur - a, parents).to(buf.ids.device)
        keys = torch.cat([buf.positions[:, :cur], nodes], dim=1)
        return positions, self.model.masks(allowed[None], keys, positions)

    # -- accept ------------------------------------------------------------
    def accept_tree(self, tree: Optional[TokenTree], chosen: Sequence[int], logits: torch.Tensor
                    ) -> Tuple[List[int], List[int], Optional[torch.Tensor], torch.Tensor, float]:
        """(path, tokens, processed, rows, seconds): the accepted nodes
        (offsets in ``chosen``), the tokens to append (the path's and the
        model's next one), the processed scores and the raw logits of the
        rows that gave them, and the forward's time up to the first token."""
        processors, config = self.processors, self.config
        processing = bool(processors) or self.scores is not None or config.do_sample
        path_tokens: List[int] = []
        processed_rows: List[torch.Tensor] = []
        row_ids: List[int] = []
        seconds: List[float] = []

        def pick(row: int) -> int:
            # the prefix this row sees: the sequence, then the path so far
            raw = logits[row:row + 1]
            if processing:
                scores = raw.float().clone() if self.raw is not None else raw.float()
                scores = self._process_row(scores, path_tokens)
                processed_rows.append(scores)
                if config.do_sample:
                    token = self._draw(scores)
                else:
                    token = int(scores.argmax(dim=-1))
            else:
                token = int(raw.argmax(dim=-1))
            if not seconds:
                seconds.append(time.perf_counter() - self._t_forward)
            row_ids.append(row)
            path_tokens.append(token)
            return token

        path, new = walk(tree, chosen, pick) if chosen else ([], [pick(0)])
        processed = torch.cat(processed_rows) if processed_rows else None
        rows = logits[row_ids]
        return path, new, processed, rows, seconds[0]

    def _process_row(self, scores: torch.Tensor, path_tokens: Sequence[int]) -> torch.Tensor:
        """The logits processors on one row ([1, V]) whose prefix is the
        sequence and then ``path_tokens``, as decoding would call them."""
        if not self.processors:
            return scores
        ids = self.buf.ids[:, :self.cur]
        if path_tokens:
            ids = torch.cat([ids, torch.tensor([list(path_tokens)], dtype=torch.long,
                                               device=ids.device)], dim=1)
        for p in self.processors:
            scores = p(ids, scores)
        return scores

    def _draw(self, scores: torch.Tensor) -> int:
        """One token from softmax(scores) ([1, V]), with torch's generator."""
        probs = torch.softmax(scores, dim=-1)
        if probs.device.type == "cpu":
            u = torch.rand(1, dtype=torch.float64).tolist()
            return _core.accept_sample([], probs.numpy(), uniforms=u)[1][0]
        return int(torch.multinomial(probs, 1))

    # -- commit ------------------------------------------------------------
    def keep_cache(self, accepted: int) -> None:
        """The context and the first ``accepted`` nodes of the path."""
        if self._chosen:
            self.model.keep_cache(len(self._chosen), self._path[:accepted])
        else:
            self.model.truncate_cache(self.cur + accepted)

    def _count(self, k: int, ngram: int, accepted: int, new: List[int], seconds: float) -> None:
        super()._count(k, ngram, accepted, new, seconds)
        if self._chosen:
            self.acceptance.update(self._tree, self._chosen,
                                   [self._chosen[i] for i in self._path], self._predicted)


# Every node pays (the prefill's tree).
_NO_BUDGET = forward_cost.ForwardCost([1, 2], [1.0, 1.0])
