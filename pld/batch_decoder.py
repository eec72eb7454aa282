"""Prompt lookup for a batch of prompts, exact per row.

:class:`BatchDecoder` steps B rows at once: one index per row, one draft per
row, one forward for the whole batch, and each row accepting its own number
of tokens.

Cache layout: one KV cache of B rows and one length T (pld.kv_cache's
OwnedCache, or any transformers cache with ``crop``). A step appends
1 + K slots to every row: the row's pending token (the one it gained last
step) and K draft slots (the row's draft, then filler where its draft is
shorter). Row r keeps its pending token and its accepted draft tokens; the
cache is cut back to the longest kept block, so a row that kept fewer
slots leaves holes. ``valid`` ([B, T]: left padding and holes are False)
is the attention mask of every later step (a 4D mask: each new token sees
its row's valid slots and the new slots before it), and every row keeps its
own position count, so a hole never shifts a position: each row sees
exactly its own tokens at their own positions, as if decoded alone. When
the cache is more than twice as long as its longest row, one gather moves
each row's slots together at the end of a shorter cache. Rows
that finish (eos, stopping criteria, their budget) leave the batch (the
cache keeps the other rows), so they cost nothing afterwards.

The width K: one forward costs about the same whatever each row's draft,
so the step picks one K for all rows, from 0 (batched greedy) to k, the one
that maximises the expected tokens of the step over the cost of a forward
of 1 + K tokens a row (measured on the model at this batch size before the
first drafted step, pld.forward_cost, and frozen). Expected tokens come
from the tree's acceptance model (a rate by n-gram size and depth, learned
during the generation). The output never depends on K.
"""
from __future__ import annotations

import time
from typing import Any, List, Optional, Sequence, Tuple

import torch

from . import _core, forward_cost
from .config import DecodeConfig
from .decoder import ROW_WISE_PROCESSORS, LoopStats
from .hf_adapter import TransformersAdapter
from .token_tree import AcceptanceModel


def check_left_padded(input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """The batch's attention mask as a bool [B, L] tensor, checked: the
    shape of input_ids, 0/1 values, every row left-padded (no 0 after a 1)
    with at least one token."""
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids: expected shape [B, L] with B >= 1 and L >= 1, got {tuple(input_ids.shape)}")
    if attention_mask is None:
        return torch.ones(input_ids.shape, dtype=torch.bool, device=input_ids.device)
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask: expected the shape of input_ids {tuple(input_ids.shape)}, "
                         f"got {tuple(attention_mask.shape)}")
    if ((attention_mask != 0) & (attention_mask != 1)).any():
        raise ValueError("attention_mask: expected 0/1 values")
    mask = attention_mask.bool()
    if not mask[:, -1].all():
        rows = (~mask[:, -1]).nonzero().flatten().tolist()
        raise ValueError(f"attention_mask: rows {rows} end in padding; batched prompt lookup needs left "
                         "padding (tokenizer.padding_side = 'left')")
    if (mask[:, 1:].int() < mask[:, :-1].int()).any():
        raise ValueError("attention_mask: a row has padding between tokens; batched prompt lookup needs "
                         "left padding (tokenizer.padding_side = 'left')")
    return mask


class BatchDecoder:
    """A batched generation after ``input_ids`` ([B, L], left-padded per
    ``attention_mask``) with a transformers causal LM behind ``model`` (a
    :class:`~pld.hf_adapter.TransformersAdapter` over an empty cache)
    under ``config`` (eos resolved). Call :meth:`step` until it returns
    False, then :meth:`sequences`."""

    def __init__(self, model: TransformersAdapter, input_ids: torch.Tensor, config: DecodeConfig, *,
                 attention_mask: Optional[torch.Tensor] = None, logits_processor: Sequence[Any] = (),
                 stopping_criteria: Sequence[Any] = (), pad_token_id: Optional[int] = None) -> None:
        self.t_start = time.perf_counter()
        mask = check_left_padded(input_ids, attention_mask)
        self.model, self.config = model, config
        self.device = input_ids.device
        self.eos = set(config.eos_token_id)
        self.processors = [in_batch(p, input_ids.shape[0]) for p in logits_processor] + config.warpers()
        self.criteria = list(stopping_criteria)
        self.pad = pad_id(pad_token_id, config)
        B, L = input_ids.shape
        self.prompt_len = L
        self.input_ids = input_ids
        self.prompts = [input_ids[r][mask[r]].tolist() for r in range(B)]
        self.new: List[List[int]] = [[] for _ in range(B)]
        self.indexes = []
        for prompt in self.prompts:
            index = _core.NgramIndex(config.max_ngram_size, config.min_ngram_size, config.policy)
            index.extend(prompt)
            index.reserve(config.max_new_tokens + config.num_pred_tokens + 1)
            self.indexes.append(index)
        self.rows = list(range(B))           # original row of each batch row still running
        self.valid = mask.clone()            # [b, T]: slots each row attends to
        self.slot_positions = (mask.long().cumsum(1) - 1).clamp(min=0)  # [b, T]: each slot's position
        self.positions = mask.long().sum(1)  # the next position of each row
        self.pending: List[List[int]] = [[] for _ in range(B)]  # tokens not yet cached
        self.cost: Optional[forward_cost.ForwardCost] = None
        self.acceptance = AcceptanceModel()
        self.stats = LoopStats()
        self.done = False
        self.compactions = 0
        self._first = True

    # -- a step --------------------------------------------------------------
    def step(self) -> bool:
        """One step for every running row: propose, verify, accept, commit."""
        drafts, ngrams = self.propose()
        logits = self.verify(drafts)
        accepted, new = self.accept(drafts, logits)
        self.commit(drafts, ngrams, accepted, new)
        return not self.done

    def propose(self) -> Tuple[List[List[int]], List[int]]:
        """Each running row's draft (cut at eos and its budget), all cut to
        the width the budget picks."""
        k = self.config.num_pred_tokens
        drafts, ngrams = [], []
        for r in self.rows:
            room = self.config.max_new_tokens - len(self.new[r]) - 1
            draft = self.indexes[r].propose(k) if room > 0 and not self._first else []
            ngram = self.indexes[r].last_ngram if draft else 0
            draft = _cut_at(draft[:room], self.eos)
            drafts.append(draft)
            ngrams.append(ngram if draft else 0)
        width = self.choose_width(drafts, ngrams)
        return [d[:width] for d in drafts], ngrams

    def choose_width(self, drafts: List[List[int]], ngrams: List[int]) -> int:
        """K in [0, longest draft] maximising the expected tokens of the
        step over the cost of a forward of 1 + K tokens a row."""
        longest = max((len(d) for d in drafts), default=0)
        if longest == 0 or not self.config.cost_aware:  # cost_aware=False: every draft in full
            return longest
        if self.cost is None:
            self.cost = self.calibrate(self.config.num_pred_tokens + 1)
        gain = [0.0] * (longest + 1)  # expected accepted tokens, summed over rows, at each K
        for draft, ngram in zip(drafts, ngrams):
            reach = 1.0
            for depth in range(1, len(draft) + 1):
                reach *= self.acceptance.rate(ngram, 1, depth)
                gain[depth] += reach
        rows = len(drafts)
        best, best_rate, total = 0, rows / self.cost(1), float(rows)
        for width in range(1, longest + 1):
            total += gain[width]
            rate = total / self.cost(1 + width)
            if rate > best_rate:
                best, best_rate = width, rate
        return best

    def calibrate(self, top: int) -> forward_cost.ForwardCost:
        """Cost of a forward of w tokens a row, in forwards of one, at this
        batch size and context (measured once per batch size and context
        size class for the model)."""
        b, T = len(self.rows), self.model.cached
        widths = [w for w in forward_cost.WIDTHS if w <= top]
        if widths[-1] < top:
            widths.append(top)
        filler = torch.tensor([self.pending[r][0] for r in self.rows], device=self.device)[:, None]

        def probe(w: int) -> None:
            ids = filler.expand(b, w)
            positions = self.positions[:, None] + torch.arange(w, device=self.device)[None]
            self.model.forward_rows(ids, positions, self._mask(positions), w)
            self.model.truncate_cache(T)

        key = ("batch", b, forward_cost.size_class(T), str(self.model.dtype), self.device.type)
        with torch.no_grad():
            return forward_cost.cached_or_measure(self.model.model, key, probe, widths)

    def verify(self, drafts: List[List[int]]) -> torch.Tensor:
        """Logits [b, 1 + K, V] (the prefill: [b, 1, V] for the last prompt token)."""
        if self._first:
            # the 2D padding mask: transformers builds the causal masks itself
            # (as batched generate does), without a float [B, L, L] of ours
            return self.model.forward_rows(self.input_ids, self.slot_positions, self.valid.long(), 1)
        width = max(len(d) for d in drafts)
        ids = torch.tensor([self.pending[r] + d + [self.pending[r][0]] * (width - len(d))
                            for r, d in zip(self.rows, drafts)], dtype=torch.long, device=self.device)
        positions = self.positions[:, None] + torch.arange(1 + width, device=self.device)[None]
        return self.model.forward_rows(ids, positions, self._mask(positions), 1 + width)

    def accept(self, drafts: List[List[int]], logits: torch.Tensor) -> Tuple[List[int], List[List[int]]]:
        """Per row: draft tokens accepted and the tokens to append."""
        accepted, new = [], []
        sample = self.config.do_sample
        for i, (r, draft) in enumerate(zip(self.rows, drafts)):
            rows = logits[i, :len(draft) + 1]
            if self.processors or sample:
                scores = self._process(r, draft, rows.float())
                if sample:
                    probs = torch.softmax(scores, dim=-1)
                    uniforms = torch.rand(len(draft) + 1, dtype=torch.float64).tolist()
                    n, tokens = _core.accept_sample(draft, probs.cpu().numpy(), uniforms=uniforms)
                else:
                    n, tokens = _core.accept_greedy(draft, scores.argmax(dim=-1).tolist())
            elif rows.device.type == "cpu":
                n, tokens = _core.accept_greedy_logits(draft, rows.contiguous())
            else:
                n, tokens = _core.accept_greedy(draft, rows.argmax(dim=-1).tolist())
            accepted.append(n)
            new.append(tokens)
        return accepted, new

    def commit(self, drafts: List[List[int]], ngrams: List[int], accepted: List[int],
               new: List[List[int]]) -> None:
        """Append each row's tokens (cut at eos, its budget, a stopping
        criterion), keep each row's cached block, drop finished rows."""
        width = max((len(d) for d in drafts), default=0)
        kept_slots = []
        finished = []
        for i, r in enumerate(self.rows):
            tokens = new[i]
            keep, stop = len(tokens), False
            for j, t in enumerate(tokens):
                if t in self.eos:
                    keep, stop = j + 1, True
                    break
            room = self.config.max_new_tokens - len(self.new[r])
            if keep >= room:
                keep, stop = room, True
            for j in range(keep if self.criteria else 0):
                if self._should_stop(r, tokens[:j + 1]):
                    keep, stop = j + 1, True
                    break
            tokens = tokens[:keep]
            self.new[r].extend(tokens)
            self.indexes[r].extend(tokens)
            n = min(accepted[i], keep)
            if not self._first:
                self._learn(ngrams[i], drafts[i], accepted[i])
                self.stats.proposed_tokens += len(drafts[i])
                self.stats.accepted_draft_tokens += n
            self.stats.new_tokens += len(tokens)
            kept_slots.append(n + (0 if self._first else 1))  # the pending token and the accepted drafts
            self.pending[r] = tokens[-1:] if not stop else self.pending[r]
            if stop:
                finished.append(i)
        self.stats.steps += 1
        if self._first:
            self._first = False
            self.positions = self.valid.long().sum(1)
            self.done = len(finished) == len(self.rows)
            self._drop(finished)
            return
        m = max(kept_slots)
        self.model.truncate_cache(self.model.cached - (1 + width - m))
        slots = torch.arange(m, device=self.device)[None]
        kept = torch.tensor(kept_slots, device=self.device)[:, None]
        self.valid = torch.cat([self.valid, slots < kept], dim=1)
        self.slot_positions = torch.cat([self.slot_positions, self.positions[:, None] + slots], dim=1)
        self.positions = self.positions + kept[:, 0]
        self.done = len(finished) == len(self.rows)
        self._drop(finished)
        if not self.done:
            self._compact_if_sparse()

    #: Compact the cache when that would shorten it by more than this share
    #: (it is then longer than its longest row by that much) and it holds
    #: at least COMPACT_MIN_SLOTS slots.
    COMPACT_SHARE = 0.5
    COMPACT_MIN_SLOTS = 64

    def _compact_if_sparse(self) -> None:
        """Move each row's valid slots to the end of a shorter cache (its
        holes become left padding), when that shortens the cache by more
        than COMPACT_SHARE: attention then reads at most about twice the
        slots of the longest row. One gather of the cache; positions
        unchanged."""
        b, T = self.valid.shape
        counts = self.valid.sum(1)
        width = int(counts.max())  # the length after compaction (the longest row)
        if T < self.COMPACT_MIN_SLOTS or width >= (1 - self.COMPACT_SHARE) * T:
            return  # (left padding that rows of unequal length need does not count)
        # row r's valid slots, in order, right-aligned in `width` new slots;
        # the padding in front repeats the row's first valid slot (masked)
        order = torch.argsort((~self.valid).int() * T + torch.arange(T, device=self.device)[None], dim=1,
                              stable=True)[:, :width]  # valid slots first, in order
        shift = width - counts  # padding in front of each row
        j = torch.arange(width, device=self.device)[None] - shift[:, None]
        index = torch.gather(order, 1, j.clamp(min=0))
        self.model.gather_slots(index)
        self.slot_positions = torch.gather(self.slot_positions, 1, index)
        self.valid = j >= 0
        self.compactions += 1

    # -- helpers -------------------------------------------------------------
    def _drop(self, finished: List[int]) -> None:
        if not finished or self.done:
            return
        keep = [i for i in range(len(self.rows)) if i not in set(finished)]
        index = torch.tensor(keep, device=self.device)
        self.model.select_rows(index)
        self.valid = self.valid[index]
        self.slot_positions = self.slot_positions[index]
        self.positions = self.positions[index]
        self.rows = [self.rows[i] for i in keep]

    def _learn(self, ngram: int, draft: List[int], accepted: int) -> None:
        """The acceptance model sees each draft token whose predecessor was accepted."""
        if not draft:
            return
        model = self.acceptance
        for depth in range(1, min(accepted + 1, len(draft)) + 1):
            b = _bucket(ngram, depth)
            model.trials[b] += 1.0
            if depth <= accepted:
                model.hits[b] += 1.0

    def _mask(self, positions: torch.Tensor) -> Any:
        """The step's attention mask(s): each of the q new tokens of a row
        (at ``positions`` [b, q]) sees its row's valid slots and the new
        slots up to itself (each sliding layer: within its window)."""
        b, T = self.valid.shape
        q = positions.shape[1]
        allowed = torch.cat([self.valid[:, None, :].expand(b, q, T),
                             torch.ones(q, q, dtype=torch.bool, device=self.device).tril()[None].expand(b, q, q)],
                            dim=2)
        return self.model.masks(allowed, torch.cat([self.slot_positions, positions], dim=1), positions)

    def _row_ids(self, r: int, extra: Sequence[int]) -> torch.Tensor:
        """Row r as batched generate shows it to processors and criteria:
        its left-padded prompt, its new tokens, then ``extra``."""
        tail = torch.tensor(self.new[r] + list(extra), dtype=torch.long, device=self.device)
        return torch.cat([self.input_ids[r], tail])[None]

    def _process(self, r: int, draft: List[int], rows: torch.Tensor) -> torch.Tensor:
        """The processors on each verified row of row r, each with its own prefix."""
        if not self.processors:
            return rows
        out = torch.empty_like(rows)
        for j in range(rows.shape[0]):
            scores = rows[j:j + 1]
            ids = self._row_ids(r, draft[:j])
            for p in self.processors:
                scores = p(ids, scores, r) if isinstance(p, RowOfBatch) else p(ids, scores)
            out[j] = scores[0]
        return out

    def _should_stop(self, r: int, tokens: Sequence[int]) -> bool:
        ids = self._row_ids(r, tokens)
        for c in self.criteria:
            done = c(ids, None)
            if bool(done.any() if isinstance(done, torch.Tensor) else done):
                return True
        return False

    def sequences(self) -> torch.Tensor:
        """[B, L + longest output]: the prompts as given, then each row's
        new tokens, the shorter ones filled with the pad id (as batched
        ``model.generate`` returns them)."""
        self.stats.total_seconds = time.perf_counter() - self.t_start
        return padded_sequences(self.input_ids, self.new, self.pad)


def pad_id(pad_token_id: Optional[int], config: DecodeConfig) -> int:
    """The id that fills finished rows: the given one, else the smallest eos id, else 0."""
    if pad_token_id is not None:
        return pad_token_id
    return min(config.eos_token_id) if config.eos_token_id else 0


def padded_sequences(input_ids: torch.Tensor, new: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    """[B, L + longest of ``new``]: the prompts as given, then each row's
    new tokens, the shorter ones filled with ``pad``."""
    longest = max(len(n) for n in new)
    tail = torch.full((len(new), longest), pad, dtype=torch.long, device=input_ids.device)
    for r, tokens in enumerate(new):
        if tokens:
            tail[r, :len(tokens)] = torch.tensor(list(tokens), dtype=torch.long)
    return torch.cat([input_ids, tail], dim=1)


def _bucket(ngram: int, depth: int):
    from .token_tree import _bucket as tree_bucket

    return tree_bucket(ngram, 1, depth)


def _cut_at(draft: List[int], eos: set) -> List[int]:
    for j, t in enumerate(draft):
        if t in eos:
            return draft[:j]
    return draft


class RowOfBatch:
    """A logits processor set up by generate() for a whole batch (say
    repetition_penalty's per-row prompt_ignore_length), called for one row:
    the row's ids and scores are repeated to the batch's size with the row
    at its own index, and its row of the output is returned. Row-wise
    processors need none of this (:func:`in_batch` leaves them be)."""

    def __init__(self, processor: Any, batch: int, row: Optional[int] = None) -> None:
        self.processor, self.batch, self.row = processor, batch, row

    def __call__(self, ids: torch.Tensor, scores: torch.Tensor, row: Optional[int] = None) -> torch.Tensor:
        """``ids`` [1, n] and ``scores`` [1, V] of row ``row`` (default: the
        row given at construction)."""
        row = self.row if row is None else row
        out = self.processor(ids.expand(self.batch, -1), scores.expand(self.batch, -1).clone())
        return out[row:row + 1]


def in_batch(processor: Any, batch: int, row: Optional[int] = None) -> Any:
    """``processor`` as it must be called one row of a ``batch`` at a time
    (``row``: always that row)."""
    if batch == 1 or type(processor).__name__ in ROW_WISE_PROCESSORS:
        return processor
    return RowOfBatch(processor, batch, row)
