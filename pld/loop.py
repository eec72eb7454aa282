"""The native prompt-lookup decoding loop: :func:`run` (one row) and
:func:`run_batch` (B rows).

A run builds a :class:`~pld.hf_adapter.TransformersAdapter` (the model and
its KV cache, the kernel choices), a :class:`~pld.decoder.Decoder` (the
step: propose, verify, accept, commit, for one row or B, linear drafts or
trees) and steps it until it is done. What the model cannot serve exactly
falls back here, with one warning: a tree to linear drafts, a batch to its
rows one at a time.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from . import _renamed
from .config import MAX_DRAFT_TOKENS, MAX_INDEX_TOKENS, DecodeConfig, check_size
from .corpus import model_signature
from .decoder import Decoder, LoopResult, LoopStats, StepRecord
from .hf_adapter import TransformersAdapter, cache_blocker, model_traits

logger = logging.getLogger("pld")

# PromptLookupCandidateGenerator reserves index room for at most this many
# new tokens up front (the loop reserves as its buffer grows).
RESERVE_MAX_NEW_TOKENS = 1 << 16

__all__ = ["run", "LoopResult", "LoopStats", "StepRecord", "check_size", "cache_blocker",
           "MAX_DRAFT_TOKENS", "MAX_INDEX_TOKENS", "DEBUG_CHECKS"]

#: After every step, check that the KV cache holds exactly the tokens the
#: step kept, and every forward after the prefill is exactly as wide as the
#: pending token and the chosen nodes (a RuntimeError naming the counts
#: otherwise). Set from
#: PLD_DEBUG_CACHE=1 at import (the test suite sets it); read by every run.
DEBUG_CHECKS = os.environ.get("PLD_DEBUG_CACHE", "") not in ("", "0")


def default_cache(model: Any, prompt_len: int, config: DecodeConfig) -> Any:
    """The loop's cache when the caller gives none: pld.kv_cache's (room for
    the prompt, the first stretch of output and a draft; it doubles as the
    output grows), or transformers' DynamicCache for a model it cannot serve."""
    from .row_state import INITIAL_NEW_TOKENS
    from .kv_cache import cache_for

    room = min(config.max_new_tokens, INITIAL_NEW_TOKENS) + config.prompt_lookup_num_tokens + 1
    # sliding-window layers kept whole: transformers' masks (2D) and pld's
    # (4D, trees) apply the windows, and a crop never loses a state
    # (transformers 4.57's sliding layers cannot be cropped past the window)
    return cache_for(model, capacity=prompt_len + room, keep_sliding=True)


def batch_cache(model: Any, prompt_len: int, config: DecodeConfig) -> Any:
    """A batch's cache when the caller gives none: room for the prompt, two
    drafts and the first stretch of output; sliding-window layers whole
    (the batch's masks apply each row's window)."""
    from .kv_cache import cache_for

    room = 2 * (config.prompt_lookup_num_tokens + 1) + min(config.max_new_tokens, 1 << 10)
    return cache_for(model, capacity=prompt_len + room, keep_sliding=True)


def tree_blocker(model: Any, cache: Any) -> Optional[str]:
    """Why a token tree cannot be verified with this model and cache, or
    None: the tree needs a cache that gathers the accepted path
    (``keep_last``), an attention that takes a 4D mask, and a model whose
    logits under pld's 4D masks were found to be plain decoding's."""
    reason = masks_blocker(model)
    if reason is None and not callable(getattr(cache, "keep_last", None)):
        reason = f"its cache ({type(cache).__name__}) cannot keep a tree's accepted path"
    return reason


def masks_blocker(model: Any) -> Optional[str]:
    """Why pld's 4D masks (trees, batches with holes) cannot serve
    ``model`` exactly, or None."""
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None) or "eager"
    if attn not in ("eager", "sdpa"):
        return f"its attention implementation ({attn}) takes no 4D attention mask"
    return model_traits(model).custom_masks


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
    ``crop`` (default: :func:`default_cache`, :func:`batch_cache`).
    ``stopping_criteria`` are called after every new token, as in plain
    decoding, so a stop inside an accepted block ends the output exactly
    where token-by-token decoding would; eos and the length budget are
    handled without them. A batch's shorter rows are filled with
    ``pad_token_id`` (default: the model's). Greedy output equals plain
    greedy decoding of each row alone (float32), whatever the options;
    sampling keeps each row's distribution. What a model cannot serve
    exactly falls back with a warning: a tree to linear drafts, a batch
    whose logits pld's 4D masks would change (:func:`masks_blocker`) to
    its rows one at a time.
    """
    config = resolve_config(model, config, _renamed.translate(options, _renamed.DECODE_CONFIG, "pld.loop.run()"))
    if config.corpus is not None:
        bind_corpus(model, config.corpus)
    if input_ids.shape[0] > 1:
        attention_mask, pad_token_id, one_at_a_time = _batch_inputs(model, input_ids, attention_mask, pad_token_id)
        if one_at_a_time:
            return _rows_one_at_a_time(model, input_ids, attention_mask, config, logits_processor or (),
                                       stopping_criteria or (), pad_token_id)
    if cache is None:
        cache = (batch_cache if input_ids.shape[0] > 1 else default_cache)(model, input_ids.shape[1], config)
    adapter = TransformersAdapter(model, cache, config.linear_kernel, check_cache=DEBUG_CHECKS)
    decoder = Decoder(adapter, input_ids, _linear_if_no_tree(model, cache, config), attention_mask=attention_mask,
                      logits_processor=logits_processor or (), stopping_criteria=stopping_criteria or (),
                      streamer=streamer, on_step=on_step, pad_token_id=pad_token_id)
    with adapter.kernels():
        while decoder.step():
            pass
    return decoder.result()


def bind_corpus(model: Any, corpus: Any) -> None:
    """Check that ``corpus`` (a pld.Corpus) holds ids of this model's
    tokenizer: none beyond its vocabulary, and the model's signature
    (vocabulary size and special ids) the one it was first used with;
    a ValueError says which."""
    config = getattr(model, "config", None)
    embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    vocab = int(weight.shape[0]) if weight is not None else int(getattr(config, "vocab_size", 0) or 0)
    corpus.bind(vocab, model_signature(vocab, config))


def run_batch(model: Any, input_ids: torch.Tensor, config: Optional[DecodeConfig] = None, *,
              attention_mask: Optional[torch.Tensor] = None, **kwargs: Any
              ) -> Tuple[torch.Tensor, List[List[int]], LoopStats]:
    """:func:`run` on a batch ([B, L], left-padded: checked even for B = 1),
    as (sequences [B, L + longest output] with shorter rows filled with
    the pad id, each row's new tokens, stats)."""
    from .batch_inputs import check_left_padded

    _renamed.translate(kwargs, _renamed.DECODE_CONFIG, "pld.loop.run_batch()")
    mask = check_left_padded(input_ids, attention_mask).long()
    result = run(model, input_ids, config, attention_mask=mask, **kwargs)
    return result.sequences, result.rows, result.stats


def _batch_inputs(model: Any, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor],
                  pad_token_id: Optional[int]) -> Tuple[torch.Tensor, Optional[int], bool]:
    """A batch's (mask [B, L] checked left-padded, pad id: the given one or
    the model's, whether its rows go one at a time: a model whose logits
    pld's 4D masks would change, with a warning)."""
    from .batch_inputs import check_left_padded

    mask = check_left_padded(input_ids, attention_mask).long()
    if pad_token_id is None:
        pad_token_id = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    reason = masks_blocker(model)
    if reason is not None:
        logger.warning("pld: decoding the batch's %d rows one at a time (%s: %s)", input_ids.shape[0],
                       type(model).__name__, reason)
    return mask, pad_token_id, reason is not None


def _linear_if_no_tree(model: Any, cache: Any, config: DecodeConfig) -> DecodeConfig:
    """``config``, or -- where a token tree cannot be verified exactly
    (:func:`tree_blocker`) -- its linear drafts, with a warning."""
    from .decoder import source_names
    from .drafts import build

    if not any(s.branches for s in build(source_names(config), config)):
        return config
    reason = tree_blocker(model, cache)
    if reason is None:
        return config
    logger.warning("pld: linear drafts instead of a token tree (%s: %s)", type(model).__name__, reason)
    return config.replace(draft_tree=False, draft_sources=None)


def _rows_one_at_a_time(model: Any, input_ids: torch.Tensor, mask: torch.Tensor, config: DecodeConfig,
                        processors: Sequence[Any], criteria: Sequence[Any], pad_token_id: Optional[int]
                        ) -> LoopResult:
    """The batch's rows, each by :func:`run` with its left padding (as
    batched generate shows a row to processors and criteria); the
    processors set up for the whole batch see each row at its index."""
    from .batch_inputs import in_batch, pad_id, padded_sequences

    B, L = input_ids.shape
    new: List[List[int]] = []
    stats = LoopStats()
    for r in range(B):
        result = run(model, input_ids[r:r + 1], config, attention_mask=mask[r:r + 1].long(),
                     logits_processor=[in_batch(p, B, r) for p in processors], stopping_criteria=criteria)
        new.append(result.sequences[0, L:].tolist())
        for name in ("steps", "new_tokens", "proposed_tokens", "accepted_draft_tokens", "forward_seconds",
                     "total_seconds"):
            setattr(stats, name, getattr(stats, name) + getattr(result.stats, name))
        stats.records.extend(result.stats.records)
    return LoopResult(sequences=padded_sequences(input_ids, new, pad_id(pad_token_id, config)), stats=stats,
                      rows=new)
