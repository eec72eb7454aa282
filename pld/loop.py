"""The native prompt-lookup decoding loop: propose, verify, accept, update.

One step:

    propose  draft = index.propose(k)                 C, O(k); on the CPU
             written straight into the sequence buffer (propose(k, out=...))
    verify   logits = model([pending..., *draft])     one forward, cache on
    accept   chosen ids on the model's device (argmax, or a draw per row from
             the processed distribution); k+1 ids to the host; n accepted in C
    update   append chosen[:n+1]; crop the cache by k-n; index.extend; stops

Nothing per step grows with the context on the host: the sequence lives in a
device buffer that the stopping criteria and logits processors see as views,
and the index only ingests the accepted tokens. The buffer starts with room
for INITIAL_NEW_TOKENS new tokens and doubles when the output needs more, so
a large ``max_new_tokens`` costs memory only as far as the output goes.
"""
from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence

import torch

from . import _core
from .draft_length import CostGate, DraftLength
from .gqa_attention import shared_kv_heads
from .linear_kernel import LinearKernel

# PromptLookupCandidateGenerator reserves index room for at most this many
# new tokens up front (the loop reserves as its buffer grows).
RESERVE_MAX_NEW_TOKENS = 1 << 16
# The sequence buffer (ids, mask, positions) starts with room for this many
# new tokens (plus a draft) and doubles as the output grows.
INITIAL_NEW_TOKENS = 1 << 10
# The C core's limits (csrc/pld_module.c PLD_MAX_DRAFT, csrc/pld.h
# PLD_INDEX_MAX_TOKENS): checked here first, with the caller's names.
MAX_DRAFT_TOKENS = 1 << 20
MAX_INDEX_TOKENS = (1 << 32) - 3

# Warpers that treat each row on its own and never read input_ids: all draft
# positions go through them in one call.
_ROW_WISE_PROCESSORS = frozenset({
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


def _row_wise(processors: Sequence[Any]) -> bool:
    return all(type(p).__name__ in _ROW_WISE_PROCESSORS for p in processors)


def _forward_accepts(model: Any, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def check_size(name: str, value: Any, minimum: int, maximum: int, why: str = "") -> int:
    """``value`` as an int in [minimum, maximum]: anything with __index__ (a
    NumPy integer...) but not a bool; a TypeError or ValueError naming
    ``name`` otherwise (``why`` explains the maximum)."""
    if isinstance(value, bool) or type(value).__name__ == "bool_" or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}{f' ({why})' if why else ''}, got {value}")
    return value


def cache_blocker(model: Any) -> Optional[str]:
    """Why ``model`` cannot keep a cropped transformers cache for the loop,
    or None when it looks able to (checked again after the prefill)."""
    if getattr(model, "_is_stateful", False):
        return "it is a stateful (recurrent) model, whose state cannot be rolled back to a prefix"
    supports = getattr(type(model), "_supports_default_dynamic_cache", None)
    if callable(supports):
        try:
            if not supports():
                return "transformers gives it no DynamicCache (_supports_default_dynamic_cache() is False)"
        except Exception:  # noqa: BLE001 - an odd class: the prefill check decides
            pass
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (AttributeError, TypeError, ValueError):
        return None
    if "past_key_values" in params:
        return None
    var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    # transformers' models name past_key_values when they take it (their
    # **kwargs are for attention/loss options); a wrapper's **kwargs may
    # pass it on, and the check after the prefill sees if it does not
    if not var_keyword or _is_transformers_model(model):
        return "its forward() takes no past_key_values (the model keeps no KV cache)"
    return None


def _is_transformers_model(model: Any) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    return isinstance(model, PreTrainedModel)


def run(
    model: Any,
    input_ids: torch.Tensor,
    *,
    cache: Any,
    max_new_tokens: int,
    num_pred_tokens: int = 10,
    max_ngram_size: int = 3,
    min_ngram_size: int = 1,
    policy: str = "first",
    semantics: str = "seed",
    eos_token_ids: Sequence[int] = (),
    attention_mask: Optional[torch.Tensor] = None,
    logits_processor: Optional[Sequence[Any]] = None,
    stopping_criteria: Optional[Sequence[Any]] = None,
    do_sample: bool = False,
    streamer: Any = None,
    output_scores: bool = False,
    output_logits: bool = False,
    on_step: Optional[Callable[[StepRecord], None]] = None,
    record_steps: bool = False,
    adaptive: bool = False,
    cost_aware: bool = False,
    linear_kernel: str = "auto",
) -> LoopResult:
    """Generate up to ``max_new_tokens`` after ``input_ids`` ([1, L]).

    ``cache`` is an empty (or prompt-free) transformers dynamic cache the
    model fills. With ``adaptive`` the draft length follows
    :class:`pld.draft_length.DraftLength` (shorter drafts, and steps without
    one, after rejections): a wide verification forward is not free. With
    ``cost_aware`` a :class:`pld.draft_length.CostGate` drops drafts from
    match sizes that have not paid for their verification on this machine
    (greedy only: under sampling every draft is verified, so that a seeded
    run repeats exactly). The output depends on neither.
    ``semantics="transformers"`` lets a match near the end propose the
    shorter continuation that exists (transformers' rule) instead of nothing
    (the method's rule); the output does not depend on that either.
    ``stopping_criteria`` are called after every new token, as
    in plain decoding, so a stop inside an accepted block ends the output
    exactly where token-by-token decoding would; eos and the length budget
    are handled here without calling them. ``linear_kernel`` picks the
    matrix product of the model's linear layers during the run
    (:mod:`pld.linear_kernel`): ``"auto"`` uses oneDNN for a float32 model
    on the CPU, whose few-token products read the weights once (with the
    embedded model an 11-token forward costs about 1.5 one-token forwards
    instead of 2-2.5); ``"torch"`` keeps torch's own. Grouped-query
    attention over several tokens reads the cache's shared key/value heads
    in place (:mod:`pld.gqa_attention`; the same numbers as transformers'
    copies).
    """
    options = dict(locals())
    del options["linear_kernel"]
    with LinearKernel(model, linear_kernel).routing(), shared_kv_heads():
        return _decode(**options)


def _decode(
    model: Any,
    input_ids: torch.Tensor,
    *,
    cache: Any,
    max_new_tokens: int,
    num_pred_tokens: int,
    max_ngram_size: int,
    min_ngram_size: int,
    policy: str,
    semantics: str,
    eos_token_ids: Sequence[int],
    attention_mask: Optional[torch.Tensor],
    logits_processor: Optional[Sequence[Any]],
    stopping_criteria: Optional[Sequence[Any]],
    do_sample: bool,
    streamer: Any,
    output_scores: bool,
    output_logits: bool,
    on_step: Optional[Callable[[StepRecord], None]],
    record_steps: bool,
    adaptive: bool,
    cost_aware: bool,
) -> LoopResult:
    """The loop of :func:`run`, inside its kernel choices."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids: expected shape [1, L], got {tuple(input_ids.shape)}")
    prompt_len = input_ids.shape[1]
    num_pred_tokens = check_size("num_pred_tokens", num_pred_tokens, 1, MAX_DRAFT_TOKENS,
                                 "the C core's limit on a draft")
    max_new_tokens = check_size("max_new_tokens", max_new_tokens, 0, MAX_INDEX_TOKENS - prompt_len,
                                f"prompt + max_new_tokens is at most {MAX_INDEX_TOKENS} tokens")
    if semantics not in ("seed", "transformers"):
        raise ValueError(f"semantics must be 'seed' or 'transformers', got {semantics!r}")
    t_start = time.perf_counter()
    device = input_ids.device
    processors = list(logits_processor or [])
    criteria = list(stopping_criteria or [])
    row_wise = _row_wise(processors)
    eos = set(int(e) for e in eos_token_ids)
    stats = LoopStats()
    scores: Optional[list] = [] if output_scores else None
    raw: Optional[list] = [] if output_logits else None

    # The buffers never need more than prompt + max_new_tokens slots (a draft
    # plus the bonus token fit the budget); they start smaller and grow.
    full = prompt_len + max_new_tokens
    capacity = min(full, prompt_len + INITIAL_NEW_TOKENS + num_pred_tokens + 1)
    seq = torch.empty((1, capacity), dtype=torch.long, device=device)
    seq[:, :prompt_len] = input_ids
    # on the CPU, a NumPy view of the same memory: propose writes drafts into
    # it (taken again after every growth)
    host_seq = seq[0].numpy() if device.type == "cpu" else None
    # Positions follow the attention mask (left padding keeps its meaning).
    if attention_mask is not None:
        if attention_mask.shape != input_ids.shape:
            raise ValueError("attention_mask: expected the shape of input_ids")
        mask = torch.ones((1, capacity), dtype=attention_mask.dtype, device=device)
        mask[:, :prompt_len] = attention_mask
        n_pad = int((attention_mask == 0).sum())
    else:
        mask = torch.ones((1, capacity), dtype=torch.long, device=device)
        n_pad = 0
    # HF's convention: positions count attended tokens; padding gets 1.
    prompt_positions = mask[:, :prompt_len].long().cumsum(-1) - 1
    prompt_positions.masked_fill_(mask[:, :prompt_len] == 0, 1)
    positions = torch.cat(
        [prompt_positions, torch.arange(prompt_len - n_pad, capacity - n_pad, device=device)[None]], dim=1)
    wants_cache_position = _forward_accepts(model, "cache_position")
    wants_logits_to_keep = _forward_accepts(model, "logits_to_keep")

    index = _core.NgramIndex(max_ngram_size, min_ngram_size, policy)
    index.extend(input_ids[0].tolist())
    # the tables' growth is paid here, not in a step: room for the tokens
    # the buffer can take, and more with each growth of the buffer
    index.reserve(capacity - prompt_len)
    cur = prompt_len          # tokens in seq
    cached = 0                # tokens in the cache
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()

    draft_length = DraftLength(num_pred_tokens, adaptive)
    # The gate reads the clock, so it would make seeded sampling depend on
    # timing (the draws follow the drafts): greedy only.
    gate = CostGate(max_ngram_size) if cost_aware and not do_sample else None
    while cur - prompt_len < max_new_tokens:
        budget = max_new_tokens - (cur - prompt_len)
        # propose: the draft plus the bonus token must fit the budget
        want = min(draft_length.next(), budget - 1)
        if cur + want + 1 > capacity:  # room for the draft and the bonus token
            capacity = min(full, max(cur + want + 1, 2 * capacity))
            seq, mask, positions = _grow(seq, mask, positions, capacity, n_pad)
            index.reserve(capacity - cur)
            if host_seq is not None:
                host_seq = seq[0].numpy()
        if want <= 0:
            draft: Sequence[int] = []
        elif host_seq is not None:  # the draft is written in place, after the sequence
            draft = host_seq[cur:cur + index.propose(want, semantics=semantics,
                                                     out=host_seq[cur:cur + want])]
        else:
            draft = index.propose(want, semantics=semantics)
        ngram = index.last_ngram if len(draft) else 0
        if gate is not None and len(draft) and not gate.allow(ngram):
            draft, ngram = [], 0
        if eos and len(draft):
            draft = _cut_at(draft, eos)
            ngram = ngram if len(draft) else 0
        k = len(draft)
        if k and host_seq is None:
            seq[0, cur:cur + k] = torch.tensor(draft, dtype=torch.long)
        # verify: the tokens not yet cached, then the draft, in one forward
        inputs = {
            "input_ids": seq[:, cached:cur + k],
            "attention_mask": mask[:, :cur + k],
            "position_ids": positions[:, cached:cur + k],
            "past_key_values": cache,
            "use_cache": True,
        }
        if wants_cache_position:
            inputs["cache_position"] = torch.arange(cached, cur + k, device=device)
        if wants_logits_to_keep:
            inputs["logits_to_keep"] = k + 1
        t_forward = time.perf_counter()
        out = model(**inputs)
        if not stats.steps:
            _check_prefill(model, out, cache, cur + k)
        logits = out.logits[0, -(k + 1):]
        # accept: choose on the model's device, k+1 ids to the host, compare in C
        processed = None
        if processors or output_scores or do_sample:
            processed = _process(processors, row_wise, seq, cur,
                                 logits.float().clone() if output_logits else logits.float())
            if do_sample:
                chosen = torch.multinomial(torch.softmax(processed, dim=-1), 1).squeeze(1).tolist()
            else:
                chosen = processed.argmax(dim=-1).tolist()
            forward_seconds = time.perf_counter() - t_forward
            n, new = _core.accept_greedy(draft, chosen)
        elif logits.device.type == "cpu":
            forward_seconds = time.perf_counter() - t_forward
            n, new = _core.accept_greedy_logits(draft, logits)  # fused argmax + compare
        else:
            chosen = logits.argmax(dim=-1).tolist()  # the host copy waits for the device
            forward_seconds = time.perf_counter() - t_forward
            n, new = _core.accept_greedy(draft, chosen)
        stats.forward_seconds += forward_seconds
        # update: eos or a stopping criterion inside the block ends it there
        stop = False
        keep = len(new)
        for j, t in enumerate(new):
            if t in eos:
                keep, stop = j + 1, True
                break
        seq[0, cur:cur + keep] = torch.tensor(new[:keep], dtype=torch.long)
        for j in range(keep if criteria else 0):
            row = processed[j:j + 1] if processed is not None else None
            if _should_stop(criteria, seq[:, :cur + j + 1], row):
                keep, stop = j + 1, True
                break
        new = new[:keep]
        accepted = min(n, keep)
        # the cache keeps the pending tokens and the accepted draft tokens
        surplus = k - accepted
        if surplus > 0:
            cache.crop(-surplus)
        cached = cur + accepted
        if scores is not None:
            scores.extend(processed[j:j + 1] for j in range(keep))
        if raw is not None:
            raw.extend(out.logits[0, j - k - 1][None].float() for j in range(keep))
        cur += keep
        index.extend(new)
        stats.steps += 1
        stats.new_tokens += keep
        stats.proposed_tokens += k
        stats.accepted_draft_tokens += accepted
        draft_length.update(k, accepted)
        if gate is not None and stats.steps > 1:  # step 1 carries the prompt
            gate.update(ngram, k, accepted, forward_seconds)
        if streamer is not None:
            streamer.put(torch.tensor(new, dtype=torch.long))
        if on_step is not None or record_steps:
            record = StepRecord(proposed=k, accepted=accepted, tokens=new)
            if record_steps:
                stats.records.append(record)
            if on_step is not None:
                on_step(record)
        if stop:
            break
    stats.total_seconds = time.perf_counter() - t_start
    return LoopResult(
        sequences=seq[:, :cur].clone(),
        stats=stats,
        scores=tuple(scores) if scores is not None else None,
        logits=tuple(raw) if raw is not None else None,
        past_key_values=cache,
    )


def _grow(seq: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, capacity: int,
          n_pad: int) -> tuple:
    """The three buffers with ``capacity`` slots, their contents kept: the
    mask is 1 and the positions count on past the old end."""
    old = seq.shape[1]
    new_seq = torch.empty((1, capacity), dtype=seq.dtype, device=seq.device)
    new_seq[:, :old] = seq
    new_mask = torch.ones((1, capacity), dtype=mask.dtype, device=mask.device)
    new_mask[:, :old] = mask
    tail = torch.arange(old - n_pad, capacity - n_pad, dtype=positions.dtype, device=positions.device)
    return new_seq, new_mask, torch.cat([positions, tail[None]], dim=1)


def _check_prefill(model: Any, out: Any, cache: Any, expected: int) -> None:
    """After the first forward the cache must hold every token fed to it: a
    model that ignores ``past_key_values`` (or keeps its own cache) would
    otherwise see only the newest tokens in the next step."""
    name = type(model).__name__
    if getattr(out, "past_key_values", None) is None:
        raise ValueError(
            f"model: {name} returned no past_key_values from its forward; pld's loop needs a model "
            "that fills the KV cache it is given (use plain model.generate() for this model)")
    held = cache.get_seq_length()
    if held != expected:
        raise ValueError(
            f"model: {name} did not fill the KV cache passed as past_key_values (it holds {held} "
            f"tokens after a forward over {expected}); pld's loop needs a model that uses the cache "
            "it is given (use plain model.generate() for this model)")


def _cut_at(draft: Sequence[int], eos: set) -> Sequence[int]:
    for j, t in enumerate(draft):
        if t in eos:
            return draft[:j]
    return draft


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
