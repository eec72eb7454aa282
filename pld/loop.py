"""The native prompt-lookup decoding loop: :func:`run` (one row or B
rows) and :func:`run_batch` (its batch form).

A run decides what the model and batch allow, once
(:func:`pld.hf_adapter.decide`: the cache, the padding mask, eos and pad,
the vocabulary, trees or linear drafts, a batch at once or its rows one at
a time), builds the draft sources (pld.drafts) and a
:class:`~pld.decoder.Decoder` (the step: propose, verify, accept, commit)
over a :class:`~pld.hf_adapter.TransformersAdapter`, and steps it until
it is done.
"""
from __future__ import annotations

import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from . import _renamed, drafts
from .batch_inputs import check_left_padded, in_batch, padded_sequences
from .config import DecodeConfig
from .decoder import Decoder, LoopResult, LoopStats, StepRecord, source_names
from .hf_adapter import TransformersAdapter, decide

__all__ = ["run", "run_batch", "prepare", "LoopResult", "LoopStats", "StepRecord", "DEBUG_CHECKS"]

#: After every step, check that the KV cache holds exactly the tokens the
#: step kept, and every forward after the prefill is exactly as wide as the
#: pending token and the chosen nodes (a RuntimeError naming the counts
#: otherwise). Set from
#: PLD_DEBUG_CACHE=1 at import (the test suite sets it); read by every run.
DEBUG_CHECKS = os.environ.get("PLD_DEBUG_CACHE", "") not in ("", "0")


def resolve_config(model: Any, config: Optional[DecodeConfig], options: dict) -> DecodeConfig:
    """The run's DecodeConfig: ``config`` (or DecodeConfig's defaults) with
    the keyword ``options`` (``eos_token_ids`` an alias of
    ``eos_token_id``), its eos resolved from the model's generation config."""
    if "eos_token_ids" in options:
        options["eos_token_id"] = options.pop("eos_token_ids")
    if config is None:
        config = DecodeConfig(**options)
    elif options:
        config = config.replace(**options)
    return config.with_model_eos(model)


def run(
    model: Any,
    input_ids: torch.Tensor,
    config: Optional[DecodeConfig] = None,
    *,
    cache: Any = None,
    attention_mask: Optional[torch.Tensor] = None,
    logits_processor: Optional[Sequence[Any]] = None,
    stopping_criteria: Optional[Sequence[Any]] = None,
    streamer: Any = None,
    on_step: Optional[Callable[[StepRecord], None]] = None,
    pad_token_id: Optional[int] = None,
    **options: Any,
) -> LoopResult:
    """Generate after ``input_ids`` ([B, L]; a batch left-padded as
    ``attention_mask`` says) with a transformers causal LM.

    The options are a :class:`~pld.config.DecodeConfig`, or its fields as
    keywords (defaults: the dataclass's; ``eos_token_ids`` is an alias of
    ``eos_token_id``). ``cache`` is an empty transformers cache with
    ``crop`` (default: pld.kv_cache's, sized for the run).
    ``stopping_criteria`` are called after every new token, as in plain
    decoding, so a stop inside an accepted block ends the output exactly
    where token-by-token decoding would; eos and the length budget are
    handled without them. A batch's shorter rows are filled with
    ``pad_token_id`` (default: the model's, else its first eos id).
    Greedy output equals plain greedy decoding of each row alone
    (float32), whatever the options; sampling keeps each row's
    distribution. What a model cannot serve exactly falls back with a
    warning (:func:`pld.hf_adapter.decide`): a tree to linear drafts, a
    batch whose logits pld's 4D masks would change to its rows one at a
    time.

    A run is: decide (the model boundary, once), build the draft sources,
    build the Decoder, step it until done.
    """
    config = resolve_config(model, config, _renamed.translate(options, _renamed.DECODE_CONFIG, "pld.loop.run()"))
    adapter, decoder = prepare(model, input_ids, config, cache=cache, attention_mask=attention_mask,
                               pad_token_id=pad_token_id, logits_processor=logits_processor or (),
                               stopping_criteria=stopping_criteria or (), streamer=streamer, on_step=on_step)
    if decoder is None:  # pld's 4D masks would change this batch's logits: its rows one at a time
        return _rows_one_at_a_time(model, input_ids, adapter, logits_processor or (), stopping_criteria or ())
    with adapter.kernels():
        while decoder.step():
            pass
    return decoder.result()


def prepare(model: Any, input_ids: torch.Tensor, config: DecodeConfig, *, cache: Any = None,
            attention_mask: Optional[torch.Tensor] = None, pad_token_id: Optional[int] = None,
            **decoder_options: Any) -> Tuple[Any, Optional[Decoder]]:
    """A run before its first step: decide (the model boundary, once), build
    the draft sources, build the Decoder (``decoder_options``: its
    keywords). Returns (adapter, decoder) -- or (the decision, None) where
    the batch's rows must go one at a time. ``config``: eos resolved."""
    Decoder.check_inputs(input_ids, config)
    sources = drafts.build(source_names(config), config)
    serving = decide(model, input_ids, config, any(s.branches for s in sources), cache=cache,
                     attention_mask=attention_mask, pad_token_id=pad_token_id)
    if serving.one_at_a_time:
        return serving, None
    if serving.config is not config:  # linear drafts instead of a tree: other sources
        sources = drafts.build(source_names(serving.config), serving.config)
    adapter = TransformersAdapter(model, serving.cache, config.linear_kernel, check_cache=DEBUG_CHECKS,
                                  traits=serving.traits)
    return adapter, Decoder(adapter, input_ids, serving, sources, **decoder_options)


def run_batch(model: Any, input_ids: torch.Tensor, config: Optional[DecodeConfig] = None, *,
              attention_mask: Optional[torch.Tensor] = None, **kwargs: Any
              ) -> Tuple[torch.Tensor, List[List[int]], LoopStats]:
    """:func:`run` on a batch ([B, L], left-padded: checked even for B = 1),
    as (sequences [B, L + longest output] with shorter rows filled with
    the pad id, each row's new tokens, stats)."""
    _renamed.translate(kwargs, _renamed.DECODE_CONFIG, "pld.loop.run_batch()")
    if input_ids.shape[0] == 1:  # (run checks a batch's padding, and takes any mask for one row)
        check_left_padded(input_ids, attention_mask)
    result = run(model, input_ids, config, attention_mask=attention_mask, **kwargs)
    return result.sequences, result.rows, result.stats


def _rows_one_at_a_time(model: Any, input_ids: torch.Tensor, serving: Any, processors: Sequence[Any],
                        criteria: Sequence[Any]) -> LoopResult:
    """The batch's rows, each by :func:`run` with its left padding (as
    batched generate shows a row to processors and criteria); the
    processors set up for the whole batch see each row at its index."""
    B, L = input_ids.shape
    new: List[List[int]] = []
    stats = LoopStats()
    for r in range(B):
        result = run(model, input_ids[r:r + 1], serving.config, attention_mask=serving.mask[r:r + 1].long(),
                     logits_processor=[in_batch(p, B, r) for p in processors], stopping_criteria=criteria)
        new.append(result.sequences[0, L:].tolist())
        for name in ("steps", "new_tokens", "proposed_tokens", "accepted_draft_tokens", "forward_seconds",
                     "total_seconds"):
            setattr(stats, name, getattr(stats, name) + getattr(result.stats, name))
        stats.records.extend(result.stats.records)
    return LoopResult(sequences=padded_sequences(input_ids, new, serving.pad), stats=stats, rows=new)
