"""One prompt-lookup generation, a step at a time.

A step is four phases, each a method of :class:`Decoder`::

    propose  draft = index.propose(k)               C, O(k): on the CPU written
             straight into the sequence buffer; the cost gate and eos cut it
    verify   logits = model([pending..., *draft])   one forward over the tokens
             the cache does not hold yet and the draft
    accept   the model's choice at the k+1 rows on its device (argmax, or a
             draw from the processed distribution), k+1 ids to the host, the
             agreeing prefix n in C
    commit   append chosen[:n+1] (cut at eos or a stopping criterion), keep
             the cache to the accepted tokens, extend the index, stats,
             streamer

The state a step reads and writes is all on the Decoder: ``buf`` (ids,
mask, positions: :class:`~pld.sequence_buffer.SequenceBuffer`), ``cur``
(tokens in the sequence), ``model.cached`` (tokens in the KV cache), the
``index`` (:class:`pld.NgramIndex`), the draft length and the cost gate.
Nothing per step grows with the context on the host.

Acceptance keeps plain decoding's tokens: greedy accepts a draft token
while it is the argmax (fused with the comparison in C for CPU logits).
Sampling is exact speculative sampling of a deterministic draft: on the CPU
the C function ``pld.accept_sample`` reads the processed probabilities
only up to the first rejection, with k+1 uniforms from torch's generator
(so ``torch.manual_seed`` makes a run repeat); on another device every
verified row is drawn there (``torch.multinomial``) and the draws are
compared with the draft. Both give each new token the model's
distribution.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

import torch

from . import _core
from .config import MAX_INDEX_TOKENS, DecodeConfig, check_size
from .draft_length import CostGate, DraftLength
from .sequence_buffer import SequenceBuffer

# The sequence buffer starts with room for this many new tokens (plus a
# draft) and doubles as the output grows.
INITIAL_NEW_TOKENS = 1 << 10

# Warpers that treat each row on its own and never read input_ids: all draft
# positions go through them in one call.
ROW_WISE_PROCESSORS = frozenset({
    "TemperatureLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
    "MinPLogitsWarper",
    "TypicalLogitsWarper",
    "EpsilonLogitsWarper",
    "EtaLogitsWarper",
    "LogitNormalization",
    "InfNanRemoveLogitsProcessor",
})


@dataclass
class StepRecord:
    """One verified step: how many draft tokens were proposed and accepted."""

    proposed: int
    accepted: int
    tokens: List[int]


@dataclass
class LoopStats:
    """What a run of the loop cost and achieved."""

    steps: int = 0
    new_tokens: int = 0
    proposed_tokens: int = 0
    accepted_draft_tokens: int = 0
    forward_seconds: float = 0.0
    total_seconds: float = 0.0
    records: List[StepRecord] = field(default_factory=list)

    @property
    def tokens_per_step(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_draft_tokens / self.proposed_tokens if self.proposed_tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_seconds if self.total_seconds else 0.0

    @property
    def forward_share(self) -> float:
        return self.forward_seconds / self.total_seconds if self.total_seconds else 0.0


@dataclass
class LoopResult:
    sequences: torch.Tensor          # [1, prompt + new] on the model's device
    stats: LoopStats
    scores: Optional[tuple] = None   # processed scores, one [1, V] per new token
    logits: Optional[tuple] = None   # raw logits, one [1, V] per new token
    past_key_values: Any = None


class Decoder:
    """A generation after ``input_ids`` ([1, L]) with ``model`` (an adapter:
    ``forward``, ``truncate_cache``, ``cached``; see pld.hf_adapter) under
    ``config`` (its eos_token_id resolved to ids). Call :meth:`step` until
    it returns False, then :meth:`result`."""

    #: The index's match policy; None: the config's.
    INDEX_POLICY: Optional[str] = None

    def __init__(self, model: Any, input_ids: torch.Tensor, config: DecodeConfig, *,
                 attention_mask: Optional[torch.Tensor] = None,
                 logits_processor: Sequence[Any] = (), stopping_criteria: Sequence[Any] = (),
                 streamer: Any = None, on_step: Any = None) -> None:
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"input_ids: expected shape [1, L], got {tuple(input_ids.shape)}")
        prompt_len = input_ids.shape[1]
        check_size("max_new_tokens", config.max_new_tokens, 1, MAX_INDEX_TOKENS - prompt_len,
                   f"prompt + max_new_tokens is at most {MAX_INDEX_TOKENS} tokens, the index's limit")
        self.t_start = time.perf_counter()
        self.model, self.config = model, config
        self.eos = set(config.eos_token_id)
        self.processors = list(logits_processor) + config.warpers()
        self.row_wise = all(type(p).__name__ in ROW_WISE_PROCESSORS for p in self.processors)
        self.criteria, self.streamer, self.on_step = list(stopping_criteria), streamer, on_step
        k = config.num_pred_tokens
        self.buf = SequenceBuffer(input_ids, attention_mask, prompt_len + config.max_new_tokens,
                                  INITIAL_NEW_TOKENS + k + 1)
        self.cur = prompt_len
        self.index = _core.NgramIndex(config.max_ngram_size, config.min_ngram_size,
                                      self.INDEX_POLICY or config.policy)
        self.index.extend(input_ids[0].tolist())
        # the tables' growth is paid here, not in a step (and with each growth of the buffer)
        self.index.reserve(self.buf.capacity - prompt_len)
        self.draft_length = DraftLength(k, config.adaptive)
        # The gate reads the clock, so it would make seeded sampling depend on
        # timing (the draws follow the drafts): greedy only.
        self.gate = CostGate(config.max_ngram_size) if config.cost_aware and not config.do_sample else None
        self.stats = LoopStats()
        self.scores: Optional[list] = [] if config.output_scores else None
        self.raw: Optional[list] = [] if config.output_logits else None
        self.done = False
        self._t_forward = 0.0

    def step(self) -> bool:
        """One step: propose, verify, accept, commit. False once done."""
        draft, ngram = self.propose()
        logits = self.verify(len(draft))
        n, new, processed, seconds = self.accept(draft, logits)
        self.commit(len(draft), ngram, n, new, processed, logits, seconds)
        return not self.done

    def propose(self) -> Tuple[Sequence[int], int]:
        """The next draft, written after the sequence, and the size of the
        n-gram match behind it (0: no draft)."""
        budget = self.config.max_new_tokens - (self.cur - self.buf.prompt_len)
        want = min(self.draft_length.next(), budget - 1)  # the draft plus the bonus token fit
        if self.buf.ensure(self.cur + max(want, 0) + 1):
            self.index.reserve(self.buf.capacity - self.cur)
        if want <= 0:
            return [], 0
        host, cur = self.buf.host, self.cur
        if host is not None:  # the index writes the draft into the sequence buffer
            draft: Sequence[int] = host[cur:cur + self.index.propose(
                want, semantics=self.config.semantics, out=host[cur:cur + want])]
        else:
            draft = self.index.propose(want, semantics=self.config.semantics)
        ngram = self.index.last_ngram if len(draft) else 0
        if self.gate is not None and len(draft) and not self.gate.allow(ngram):
            return [], 0
        if self.eos and len(draft):
            draft = _cut_at(draft, self.eos)
        if host is None:
            self.buf.write(cur, draft)
        return draft, (ngram if len(draft) else 0)

    def verify(self, k: int) -> torch.Tensor:
        """Logits [k+1, V]: one forward over the tokens the cache does not
        hold yet, then the k draft tokens."""
        a, b = self.model.cached, self.cur + k
        self._t_forward = time.perf_counter()
        return self.model.forward(self.buf.ids[:, a:b], self.buf.positions[:, a:b],
                                  self.buf.mask[:, :b], k + 1)

    def accept(self, draft: Sequence[int], logits: torch.Tensor
               ) -> Tuple[int, List[int], Optional[torch.Tensor], float]:
        """(n, tokens, processed, seconds): n accepted draft tokens, the n+1
        tokens to append, the processed scores (None without processors,
        scores or sampling) and the forward's time up to the ids' arrival."""
        processed = None
        if self.processors or self.scores is not None or self.config.do_sample:
            scores = logits.float().clone() if self.raw is not None else logits.float()
            processed = _process(self.processors, self.row_wise, self.buf.ids, self.cur, scores)
            if self.config.do_sample and processed.device.type == "cpu":
                probs = torch.softmax(processed, dim=-1).numpy()
                uniforms = torch.rand(len(draft) + 1, dtype=torch.float64).tolist()
                seconds = time.perf_counter() - self._t_forward
                n, new = _core.accept_sample(draft, probs, uniforms=uniforms)
                return n, new, processed, seconds
            if self.config.do_sample:
                chosen = torch.multinomial(torch.softmax(processed, dim=-1), 1).squeeze(1).tolist()
            else:
                chosen = processed.argmax(dim=-1).tolist()
            seconds = time.perf_counter() - self._t_forward
            n, new = _core.accept_greedy(draft, chosen)
        elif logits.device.type == "cpu":
            seconds = time.perf_counter() - self._t_forward
            n, new = _core.accept_greedy_logits(draft, logits)  # fused argmax + compare
        else:
            chosen = logits.argmax(dim=-1).tolist()  # the host copy waits for the device
            seconds = time.perf_counter() - self._t_forward
            n, new = _core.accept_greedy(draft, chosen)
        return n, new, processed, seconds

    def commit(self, k: int, ngram: int, n: int, new: List[int], processed: Optional[torch.Tensor],
               logits: torch.Tensor, seconds: float) -> None:
        """Append what the step gained (cut at eos or a stopping criterion,
        as token-by-token decoding would stop), keep the cache to the
        pending and accepted tokens, and tell the index, the stats, the
        streamer and the callback."""
        keep, stop = _eos_cut(new, self.eos)
        self.buf.write(self.cur, new[:keep])
        keep, stop = self._criteria_cut(keep, stop, processed)
        new, accepted = new[:keep], min(n, keep)
        self.keep_cache(accepted)
        if self.scores is not None:
            self.scores.extend(processed[j:j + 1] for j in range(keep))
        if self.raw is not None:
            self.raw.extend(logits[j][None].float() for j in range(keep))
        self.cur += keep
        self.index.extend(new)
        self._count(k, ngram, accepted, new, seconds)
        if self.streamer is not None:
            self.streamer.put(torch.tensor(new, dtype=torch.long))
        if self.on_step is not None or self.config.record_steps:
            record = StepRecord(proposed=k, accepted=accepted, tokens=new)
            if self.config.record_steps:
                self.stats.records.append(record)
            if self.on_step is not None:
                self.on_step(record)
        self.done = stop or self.cur - self.buf.prompt_len >= self.config.max_new_tokens

    def keep_cache(self, accepted: int) -> None:
        """After a step the cache holds the sequence and the first
        ``accepted`` draft tokens."""
        self.model.truncate_cache(self.cur + accepted)

    def result(self) -> LoopResult:
        self.stats.total_seconds = time.perf_counter() - self.t_start
        return LoopResult(
            sequences=self.buf.ids[:, :self.cur].clone(),
            stats=self.stats,
            scores=tuple(self.scores) if self.scores is not None else None,
            logits=tuple(self.raw) if self.raw is not None else None,
            past_key_values=self.model.cache,
        )

    def _criteria_cut(self, keep: int, stop: bool, processed: Optional[torch.Tensor]) -> Tuple[int, bool]:
        """The stopping criteria after every new token, as plain decoding calls them."""
        for j in range(keep if self.criteria else 0):
            row = processed[j:j + 1] if processed is not None else None
            if _should_stop(self.criteria, self.buf.ids[:, :self.cur + j + 1], row):
                return j + 1, True
        return keep, stop

    def _count(self, k: int, ngram: int, accepted: int, new: List[int], seconds: float) -> None:
        stats = self.stats
        stats.forward_seconds += seconds
        stats.steps += 1
        stats.new_tokens += len(new)
        stats.proposed_tokens += k
        stats.accepted_draft_tokens += accepted
        self.draft_length.update(k, accepted)
        if self.gate is not None and stats.steps > 1:  # step 1 carries the prompt
            self.gate.update(ngram, k, accepted, seconds)


def _cut_at(draft: Sequence[int], eos: set) -> Sequence[int]:
    for j, t in enumerate(draft):
        if t in eos:
            return draft[:j]
    return draft


def _eos_cut(new: List[int], eos: set) -> Tuple[int, bool]:
    """How many of ``new`` to keep: through the first eos (and stop there)."""
    for j, t in enumerate(new):
        if t in eos:
            return j + 1, True
    return len(new), False


def _process(processors: Sequence[Any], row_wise: bool, seq: torch.Tensor, cur: int,
             logits: torch.Tensor) -> torch.Tensor:
    """Apply the logits processors to the k+1 verified rows; row i sees the
    sequence extended by the first i draft tokens, as decoding would."""
    if not processors:
        return logits
    rows = logits.shape[0]
    if row_wise:
        ids = seq[:, :cur].expand(rows, cur)
        for p in processors:
            logits = p(ids, logits)
        return logits
    out = torch.empty_like(logits)
    for i in range(rows):
        row = logits[i:i + 1]
        ids = seq[:, :cur + i]
        for p in processors:
            row = p(ids, row)
        out[i] = row[0]
    return out


def _should_stop(criteria: Sequence[Any], ids: torch.Tensor, scores: Optional[torch.Tensor]) -> bool:
    for c in criteria:
        done = c(ids, scores)
        if bool(done.any() if isinstance(done, torch.Tensor) else done):
            return True
    return False
