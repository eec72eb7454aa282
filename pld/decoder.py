"""One prompt-lookup generation over B >= 1 rows, a step at a time.

Every step is the same four phases for every shape -- one row or a batch,
a linear draft (a tree with one branch) or a token tree, or no draft (the
root alone)::

    propose  every running row asks the draft sources (pld.drafts) for
             candidates, merged into its trie; the width budget
             (pld.width_budget) picks each row's nodes for one rectangular
             forward: W slots a row, filler where a row has fewer
    verify   one forward through the adapter (pld.hf_adapter): each row's
             pending token(s), then its nodes; node i at its row's
             position + depth(i), seeing its row's cached tokens, the
             pending ones, its ancestors and itself (a 2D mask where that
             is plain causal attention, else a 4D mask)
    accept   each row walks its tree from the root along the model's own
             choices, argmax or exact sampling, in C (pld.accept_walk;
             in Python only where a logits processor must see the path)
    commit   each row appends its tokens (cut at eos, its budget or a
             stopping criterion), keeps its pending token and accepted
             path in the cache (one row: gathered to the front, so the
             cache holds exactly its tokens; a batch: the rest of the
             block becomes holes its mask hides, pld.slot_table), learns
             (acceptance model, draft length, sources), reports (stats,
             scores, streamer, on_step) and leaves the batch when done

After the prefill every forward is exactly as wide as the pending token
plus the chosen nodes (checked after every step with PLD_DEBUG_CACHE=1,
with the cache holding exactly each row's kept tokens).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, List, Optional, Sequence, Tuple

import torch

from . import accept_walk, forward_cost
from .accept_walk import Picker, Walk, walk_row
from .batch_inputs import ROW_WISE_PROCESSORS, in_batch, padded_sequences
from .config import MAX_INDEX_TOKENS, MAX_TREE_WIDTH, DecodeConfig, check_size, eos_at
from .drafts.base import DraftSource, Proposal
from .records import LoopResult, LoopStats, StepRecord
from .row_state import INITIAL_NEW_TOKENS, Row
from .slot_table import SlotTable
from .token_tree import (CORPUS, AcceptanceModel, TokenTree, block_visibility, is_chain, local_parents,
                         within_vocabulary)
from .width_budget import CHAIN_EXPLORATION, NO_BUDGET, WidthBudget

__all__ = ["Decoder", "LoopResult", "LoopStats", "StepRecord", "ROW_WISE_PROCESSORS", "INITIAL_NEW_TOKENS"]


@dataclass
class Plan:
    """A row's step: its candidate tree (None: no draft), the chosen nodes
    (creation order) and their predicted accepted count; the chosen
    nodes' tokens, parents among them (-1: the root) and depths."""

    tree: Optional[TokenTree]
    chosen: List[int]
    predicted: float = 0.0

    def __post_init__(self) -> None:
        tree, chosen = self.tree, self.chosen if self.tree is not None else []
        self.nodes = [tree.tokens[j] for j in chosen]
        self.parents = local_parents(tree, chosen) if chosen else []
        self.depths = [tree.depths[j] for j in chosen]


def source_names(config: DecodeConfig) -> Tuple[str, ...]:
    """The draft sources a config asks for."""
    if config.draft_sources is not None:
        return config.draft_sources
    if not config.draft_tree:
        names: Tuple[str, ...] = ("prompt",)
    else:
        names = ("prompt_tree", "ahead", "successors") if config.tree_successors else ("prompt_tree",)
    return names + ("siblings",) * config.sibling_drafts + ("corpus",) * (config.corpus is not None)


class Decoder:
    """A generation after ``input_ids`` ([B, L]) through ``model`` (a
    pld.hf_adapter adapter over the empty cache ``serving`` decided) with
    ``sources`` (pld.drafts.build of ``serving.config``'s). Call
    :meth:`step` until it returns False, then :meth:`result`.
    ``acceptance`` and ``budget`` replace the default acceptance model and
    width budget."""

    def __init__(self, model: Any, input_ids: torch.Tensor, serving: Any, sources: Sequence[DraftSource], *,
                 logits_processor: Sequence[Any] = (), stopping_criteria: Sequence[Any] = (),
                 streamer: Any = None, on_step: Any = None, acceptance: Optional[AcceptanceModel] = None,
                 budget: Optional[WidthBudget] = None) -> None:
        self.t_start = time.perf_counter()
        config = serving.config
        B, L = self.check_inputs(input_ids, config)
        mask = serving.mask
        self.model, self.config, self.input_ids = model, config, input_ids
        self.eos = tuple(config.eos_token_id)
        self.vocab = serving.vocab  # draft tokens must be ids the model embeds
        self.processors = [in_batch(p, B) for p in logits_processor] + config.warpers()
        self.row_wise = all(type(p).__name__ in ROW_WISE_PROCESSORS for p in self.processors)
        self.criteria, self.streamer, self.on_step = list(stopping_criteria), streamer, on_step
        self.sources = list(sources)
        policy = "recent" if any(s.branches for s in self.sources) else config.policy
        self.rows = [Row(r, input_ids[r:r + 1], None if mask is None else mask[r:r + 1].long(), config, policy)
                     for r in range(B)]
        self.all_rows = list(self.rows)
        if config.do_sample:  # each row its own uniforms: its tokens never depend on another row's drafts
            for row, seed in zip(self.rows, accept_walk.UniformStream.seeds(B)):
                row.uniforms = accept_walk.UniformStream(seed)
        if config.sibling_drafts:
            _link_siblings(self.rows, input_ids, mask)
        self.slots = SlotTable(B, input_ids.device, L + 2 * (config.prompt_lookup_num_tokens + 1) + 64)
        self.acceptance = acceptance if acceptance is not None else AcceptanceModel()
        self._corpus_counts = None  # the corpus nodes' counts as the generation began
        if config.corpus is not None:  # what earlier generations learned of the corpus's drafts
            self.acceptance.add_counts(CORPUS, *config.corpus.acceptance())
            self._corpus_counts = self.acceptance.counts(CORPUS)
        branches = any(s.branches for s in self.sources)
        self.budget = budget if budget is not None else (
            WidthBudget(config.tree_width) if branches
            else WidthBudget(config.prompt_lookup_num_tokens, CHAIN_EXPLORATION))
        self.cost: Any = None  # c(w): learned (pld.forward_cost), or a fixed table
        self._wait = forward_cost.waiter(input_ids.device)
        self.pad = serving.pad
        self.stats = LoopStats()
        self.done = False
        self.prefill = True
        self._t_forward = 0.0

    @staticmethod
    def check_inputs(input_ids: torch.Tensor, config: DecodeConfig) -> Tuple[int, int]:
        """(B, L) of ``input_ids``, or a ValueError naming what is wrong."""
        if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
            raise ValueError(f"input_ids: expected shape [B, L] with B >= 1 and L >= 1, got {tuple(input_ids.shape)}")
        B, L = input_ids.shape
        check_size("max_new_tokens", config.max_new_tokens, 1, MAX_INDEX_TOKENS - L,
                   f"prompt + max_new_tokens is at most {MAX_INDEX_TOKENS} tokens, the index's limit")
        return B, L

    # -- the step ------------------------------------------------------------
    def step(self) -> bool:
        """One step for every running row: propose, verify, accept, commit. False once done."""
        plans = self.propose()
        logits = self.verify(plans)
        walks = self.accept(plans, logits)
        self.commit(plans, walks, logits)
        return not self.done

    def propose(self) -> List[Plan]:
        """Every running row's candidate tree and the nodes of it to verify."""
        trees = [self._candidates(row) for row in self.rows]
        if all(t is None for t in trees):
            return [Plan(None, []) for _ in trees]
        chosen, predicted = self.budget.choose(trees, self.acceptance, self._cost(), self.pending)
        return [Plan(t if c else None, c, p) for t, c, p in zip(trees, chosen, predicted)]

    def verify(self, plans: List[Plan]) -> torch.Tensor:
        """Logits [b, 1 + W, V]: each row's root (its last pending token),
        then its W node slots."""
        nodes, parents, depths = [p.nodes for p in plans], [p.parents for p in plans], [p.depths for p in plans]
        width = self.pending + max(len(n) for n in nodes)
        self._t_forward = time.perf_counter()
        if self.cost is None or self.prefill:
            return self._forward(nodes, parents, depths)
        self._wait()  # (the step's forward alone: the device done with what came before)
        t0 = forward_cost.clock()
        logits = self._forward(nodes, parents, depths)
        self._wait()
        self.cost.observe(width, forward_cost.clock() - t0)  # a sample of what a forward costs
        return logits

    def accept(self, plans: List[Plan], logits: torch.Tensor) -> List[Walk]:
        """Each row's walk of its tree (pld.accept_walk)."""
        config = self.config
        fast = not (self.processors or config.do_sample or config.output_scores)
        top = logits.argmax(dim=-1).tolist() if fast else None  # one copy to the host
        walks = [self._accept_row(row, plan, logits[i], top[i] if fast else None)
                 for i, (row, plan) in enumerate(zip(self.rows, plans))]
        self.stats.forward_seconds += time.perf_counter() - self._t_forward
        return walks

    def _accept_row(self, row: Row, plan: Plan, logits: torch.Tensor, top: Optional[List[int]]) -> Walk:
        """One row's walk, in C along ``top`` (the argmax at each position:
        greedy without processors or scores) or along its processed scores,
        all positions in one call where the processors act on each row as a
        whole; in Python where a processor must see the path so far."""
        nodes, parents, depths = plan.nodes, plan.parents, plan.depths
        if top is not None:
            return accept_walk.greedy(nodes, parents, top[:1 + len(nodes)])
        u = accept_walk.Uniforms(depths, row.uniforms) if row.uniforms is not None else None  # greedy draws nothing
        if not self.row_wise:
            picker = Picker(logits, self.processors, row, u, self.config.output_scores)
            return walk_row(plan.tree, plan.chosen, picker)
        scores = accept_walk.process(logits[:1 + len(nodes)].float(), self.processors, row, 0)
        return accept_walk.from_scores(scores, nodes, parents, depths, u, self.config.output_scores)

    def commit(self, plans: List[Plan], walks: List[Walk], logits: torch.Tensor) -> None:
        """Append, keep the cache, learn, report; finished rows leave."""
        kept, finished = [], []
        P = self.pending
        for i, (row, plan, w) in enumerate(zip(self.rows, plans, walks)):
            keep, stop = self._cut(row, w)
            self._learn(row, plan, w, logits[i], keep)
            self._report(row, plan, w, logits[i], keep)
            row.append(w.tokens[:keep])
            kept.append(list(range(P)) + [P + j for j in w.path[:keep - 1]])
            if stop or row.new_count >= self.config.max_new_tokens:
                finished.append(i)
        self.stats.steps += 1
        self._keep_cache(kept)
        self._drop(finished)
        self.prefill = False

    # -- propose ---------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Tokens every running row has that the cache lacks (the prompt, then 1)."""
        row = self.rows[0]
        return row.cur - row.cached

    def _candidates(self, row: Row) -> Optional[TokenTree]:
        """The row's candidate tree from every source (None: no draft)."""
        room = self.config.max_new_tokens - row.new_count
        depth = min(row.draft_length.next(), room - 1)
        if self.prefill and len(self.all_rows) > 1:
            depth = 0  # a batch's prefill: transformers' own masks for the left padding
        row.begin_step(depth)
        if depth <= 0:
            return None
        ask = Proposal(depth, min(MAX_TREE_WIDTH, 2 * self.config.tree_width), self.eos,
                       self.config.tree_candidates)
        tree = TokenTree([], [], [], [], [])
        for source in self.sources:
            tree = source.propose(row, tree, ask)
        tree = within_vocabulary(tree, self.vocab)  # no source feeds the model an id it lacks
        return tree if len(tree) else None

    def _cost(self) -> Any:
        """c(w) of this step's forwards: flat (every node pays) for the
        prefill and with cost_aware=False, else learned (pld.forward_cost)."""
        if self.prefill or not self.config.cost_aware:
            return NO_BUDGET
        if self.cost is None:
            self.cost = self.calibrate()
        return self.cost

    def calibrate(self) -> Any:
        """The learned c(w) of a forward of w tokens a row at this batch size
        and context (pld.forward_cost.LearnedCost, kept for the model per
        batch size, context size class, dtype, device and kernel): the one
        earlier generations taught, or a new one from two probe forwards.
        Every later verification forward teaches it (:meth:`verify`)."""
        P, b, T = self.pending, len(self.rows), self.model.cached
        top = min(MAX_TREE_WIDTH, self.budget.max_width) + P

        def probe(w: int) -> None:
            n = max(w - P, 0)
            self._forward([[r.root] * n for r in self.rows], [list(range(-1, n - 1))] * b,
                          [list(range(1, n + 1))] * b)
            self.model.truncate_cache(T)

        key = ("step", b, forward_cost.size_class(T), str(self.model.dtype), self.input_ids.device.type,
               self.config.linear_kernel, P)
        return self.model.learned_cost(key, probe, sorted({P, top}), self._wait)

    # -- verify ----------------------------------------------------------------
    def _forward(self, nodes: List[List[int]], parents: List[List[int]], depths: List[List[int]]) -> torch.Tensor:
        """One forward over every row's pending tokens and node slots
        (``nodes`` tokens, local ``parents``, ``depths``; filler up to the
        widest row): logits [b, 1 + W, V]. Stages the block's slots."""
        chains = all(is_chain(p) for p in parents)
        if self.prefill and not chains:
            self._prefill_all_but_the_root()
        W = max(len(n) for n in nodes)
        pending = [row.pending() for row in self.rows]
        device = self.input_ids.device
        filled = [n + [row.root] * (W - len(n)) for n, row in zip(nodes, self.rows)]
        steps = [d + [1] * (W - len(d)) for d in depths]
        ids = torch.cat([torch.cat([p[0] for p in pending]),
                         torch.tensor(filled, dtype=torch.long, device=device).view(len(nodes), W)], dim=1)
        base = torch.cat([p[1] for p in pending])
        positions = torch.cat([base, base[:, -1:] + torch.tensor(steps, dtype=base.dtype, device=device)
                               .view(len(nodes), W)], dim=1)
        valid = torch.cat([torch.cat([p[2] for p in pending]),
                           torch.ones((len(nodes), W), dtype=torch.bool, device=device)], dim=1)
        T = self.slots.length
        self.slots.stage(valid, positions)
        if (self.prefill or len(self.all_rows) == 1) and chains:
            mask = self.slots.valid[:, :T + ids.shape[1]].long()  # plain causal attention: a 2D mask
        else:
            mask = self._masks(pending, parents, W, positions)
        return self.model.forward_rows(ids, positions, mask, 1 + W)

    def _prefill_all_but_the_root(self) -> None:
        """The prompt but its last token into the cache, in one causal
        forward with a 2D mask, so that a tree's first forward is as wide
        as any step's (its 4D mask over the whole prompt would have P^2
        entries: 4 GiB of float32 at 32k tokens). One row: a batch's
        prefill drafts nothing."""
        (row,) = self.rows
        ids, positions, valid = row.pending()
        n = ids.shape[1] - 1
        if n <= 0:
            return
        T = self.slots.length
        self.slots.stage(valid[:, :n], positions[:, :n])
        self.model.forward_rows(ids[:, :n], positions[:, :n], self.slots.valid[:, :T + n].long(), 1)
        self.slots.keep([list(range(n))], gather=True)
        row.cached += n

    def _masks(self, pending: list, parents: List[List[int]], W: int, positions: torch.Tensor) -> Any:
        """The 4D mask(s): every query sees its row's valid cached slots,
        then the block as pld.token_tree.block_visibility says (one pending
        token a row: a tree's prefill ran causally, a batch's drafts nothing)."""
        T = self.slots.length
        b, q = positions.shape
        block = torch.stack([block_visibility(par, W, bool(p[2][0, 0])) for p, par in zip(pending, parents)])
        allowed = torch.cat([self.slots.valid[:, None, :T].expand(b, q, T), block.to(positions.device)], dim=2)
        keys = torch.cat([self.slots.positions[:, :T], positions], dim=1)
        return self.model.masks(allowed, keys, positions)

    # -- commit ----------------------------------------------------------------
    def _cut(self, row: Row, w: Walk) -> Tuple[int, bool]:
        """How many of the walk's tokens to keep, and whether the row
        stops: through the first eos, within its budget, up to the first
        token after which a stopping criterion says stop (called after
        every new token, as plain decoding does)."""
        at = eos_at(w.tokens, self.eos)
        keep, stop = (len(w.tokens), False) if at is None else (at + 1, True)
        room = self.config.max_new_tokens - row.new_count
        if keep >= room:
            keep, stop = room, True
        row.write(w.tokens[:keep])
        for j in range(keep if self.criteria else 0):
            # (generate()'s scores: every new token's processed scores so far, kept only with output_scores)
            scores = None if row.scores is None else tuple(row.scores) + tuple(w.processed[:j + 1])
            if _should_stop(self.criteria, row.ids(j + 1), scores):
                return j + 1, True
        return keep, stop

    def _learn(self, row: Row, plan: Plan, w: Walk, logits: torch.Tensor, keep: int) -> None:
        """The acceptance model, the draft length and the sources learn from the step."""
        if plan.chosen:
            path = [plan.chosen[i] for i in w.path]
            self.acceptance.update(plan.tree, plan.chosen, path, plan.predicted)
            row.draft_length.update(max(plan.depths), len(w.path))
        inputs, before = [row.root], [row.previous]
        if plan.chosen:
            above = [row.root if p < 0 else plan.tree.tokens[p] for p in plan.tree.parents]
            inputs += plan.nodes
            before += [above[j] for j in plan.chosen]
        for source in self.sources:
            source.observe(row, inputs, before, logits[:len(inputs)])

    def _report(self, row: Row, plan: Plan, w: Walk, logits: torch.Tensor, keep: int) -> None:
        """Stats, kept scores and logits, the streamer and the step record."""
        tokens, accepted = w.tokens[:keep], min(len(w.path), keep)
        stats = self.stats
        stats.new_tokens += keep
        stats.proposed_tokens += len(plan.chosen)
        stats.accepted_draft_tokens += accepted
        if row.scores is not None:
            row.scores.extend(w.processed[:keep])
        if row.raw is not None:
            row.raw.extend(logits[p][None].float() for p in w.positions[:keep])
        if self.streamer is not None:
            self.streamer.put(torch.tensor(tokens, dtype=torch.long))
        if self.on_step is None and not self.config.record_steps:
            return
        record = StepRecord(len(plan.chosen), accepted, tokens, row.batch_index)
        if self.config.record_steps:
            stats.records.append(record)
        if self.on_step is not None:
            self.on_step(replace(record, tree=plan.tree, chosen=plan.chosen,
                                 path=[plan.chosen[i] for i in w.path], predicted=plan.predicted))

    def _keep_cache(self, kept: List[List[int]]) -> None:
        """Each row keeps its ``kept`` block offsets: one row gathers them
        (a crop where they are the block's start), a batch keeps holes."""
        q = self.model.cached - self.slots.length
        one = len(self.all_rows) == 1
        m = self.slots.keep(kept, gather=one)
        if one and kept[0] != list(range(len(kept[0]))):
            self.model.keep_cache(q, kept[0])
        else:
            self.model.truncate_cache(self.slots.length)
        if not one:
            index = self.slots.compaction_index()
            if index is not None:
                self.model.gather_slots(index)
                self.slots.gather(index)
        if self.model.check_cache:
            self._check_held(m)

    def _check_held(self, m: int) -> None:
        """PLD_DEBUG_CACHE: the cache holds exactly each row's tokens but its last."""
        held = self.slots.held()
        want = [int(row.buf.mask[0, :row.cur - 1].ne(0).sum()) for row in self.rows]
        if held != want or self.model.cached != self.slots.length:
            raise RuntimeError(f"pld: after a step the rows hold {held} cached tokens, their sequences "
                               f"{want} (the cache {self.model.cached} slots, the table {self.slots.length})")

    def _drop(self, finished: List[int]) -> None:
        corpus = self.config.corpus
        if corpus is not None and self.config.corpus_add:
            for i in finished:
                corpus.offer(self.rows[i].new_tokens())  # never at the cost of the output
        if len(finished) == len(self.rows):
            self.done = True
            self._teach_corpus()
            return
        if finished:
            keep = [i for i in range(len(self.rows)) if i not in set(finished)]
            index = torch.tensor(keep, device=self.input_ids.device)
            self.model.select_rows(index)
            self.slots.select_rows(index)
            self.rows = [self.rows[i] for i in keep]

    def _teach_corpus(self) -> None:
        """Hand the corpus what this generation learned of its drafts."""
        if self._corpus_counts is None:
            return
        (h0, t0), (h1, t1) = self._corpus_counts, self.acceptance.counts(CORPUS)
        # whole counts: a step adds 1 to a bucket (the rounding undoes the sums' float error)
        trials = {b: float(round(t1[b] - t0[b])) for b in t1 if t1[b] - t0[b] > 0.5}
        self.config.corpus.learn({b: float(round(h1[b] - h0[b])) for b in trials}, trials)

    # -- the result --------------------------------------------------------------
    def result(self) -> LoopResult:
        self.stats.total_seconds = time.perf_counter() - self.t_start
        rows = [row.new_tokens() for row in self.all_rows]
        if len(self.all_rows) == 1:
            row = self.all_rows[0]
            sequences = row.buf.ids[:, :row.cur].clone()
        else:
            sequences = padded_sequences(self.input_ids, rows, self.pad)
        first = self.all_rows[0]
        return LoopResult(
            sequences=sequences, stats=self.stats,
            scores=tuple(first.scores) if first.scores is not None else None,
            logits=tuple(first.raw) if first.raw is not None else None,
            past_key_values=self.model.cache, rows=rows)


def _link_siblings(rows: List[Row], input_ids: torch.Tensor, mask: Optional[torch.Tensor]) -> None:
    """Give every row the other rows with the same prompt (ids and mask)."""
    groups: dict = {}
    for r, row in enumerate(rows):
        key = (tuple(input_ids[r].tolist()), None if mask is None else tuple(mask[r].tolist()))
        groups.setdefault(key, []).append(row)
    for group in groups.values():
        for row in group:
            row.siblings = [s for s in group if s is not row]


def _should_stop(criteria: Sequence[Any], ids: torch.Tensor, scores: Optional[Tuple[torch.Tensor, ...]]) -> bool:
    """Whether any criterion says stop; every one is called, as
    transformers' StoppingCriteriaList calls them (a criterion may count
    its calls)."""
    stop = False
    for c in criteria:
        done = c(ids, scores)
        stop = bool(done.any() if isinstance(done, torch.Tensor) else done) or stop
    return stop
