"""The switch inside transformers' ``generate()``: with :func:`enable`,
``model.generate(..., prompt_lookup_num_tokens=k)`` runs pld's native loop
(pld.loop.run). This module only translates a generate() call's arguments
-- its generation_config, cache, processors, criteria, streamer -- into
the loop's, and its result back into generate()'s output.

enable() swaps three things and disable() puts them back:
- ``transformers.generation.utils.PromptLookupCandidateGenerator`` (bound
  there at import, so that is the name generate() resolves) for pld's
  (pld.candidate_generator);
- ``GenerationMixin._assisted_decoding``, which generate() looks up on the
  model's class: the replacement serves prompt lookup natively; a call it
  cannot serve goes, with one warning, to transformers' assisted decoding
  (the original, drafting with pld's candidate generator) where that is
  exact (:func:`_assisted_decoding_serves`: an encoder-decoder model's
  single row, nothing it was found to get wrong), else to transformers'
  plain decoding (``_sample``): the tokens of generate() without prompt
  lookup;
- ``GenerationMixin._validate_generation_mode``, so a prompt-lookup call
  may ask for num_return_sequences > 1, and a stateful model's reaches
  the replacement (which decodes it plainly).
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import inspect
import logging
import threading
from typing import Any, Iterator, Optional, Tuple

import torch
from transformers.generation import utils as _gen_utils

from . import _renamed, loop
from .batch_inputs import ROW_WISE_PROCESSORS, check_mask
from .candidate_generator import PromptLookupCandidateGenerator
from .config import MAX_DRAFT_TOKENS, MAX_INDEX_TOKENS, DecodeConfig, check_size, eos_ids
from .hf_adapter import cache_blocker

logger = logging.getLogger("pld")

# Model inputs the native loop knows how to carry; anything else (images,
# encoder outputs, token types...) goes to transformers.
_NATIVE_MODEL_KWARGS = frozenset({
    "attention_mask", "past_key_values", "cache", "use_cache", "cache_position", "position_ids",
    "output_attentions", "output_hidden_states", "return_dict", "logits_to_keep",
})
# The field of generate()'s output that holds the cache (5.24: ``cache``).
_OUTPUT_CACHE = ("cache" if "cache" in getattr(_gen_utils.GenerateDecoderOnlyOutput, "__dataclass_fields__", {})
                 else "past_key_values")
# Stopping criteria the loop applies itself (eos and the length budget).
_NATIVE_CRITERIA = frozenset({"MaxLengthCriteria", "MaxNewTokensCriteria", "EosTokenCriteria"})
# transformers' criteria that decide each row on its own tokens (stop
# strings) or all rows alike (time), so the loop may apply them row by row
# in a batch (where an eos id pads a stopped row, as generate() does).
_BATCHED_CRITERIA = frozenset({"StopStringCriteria", "MaxTimeCriteria"})
# transformers' processors that are pure functions of (input_ids, scores),
# row by row: in a batch the loop calls them one row at a time
# (batch_inputs.RowOfBatch). Any other (SynthID's watermark, classifier-free
# guidance, one of the caller's) may keep state across calls, and a batch
# with it goes to transformers' plain decoding.
STATELESS_PROCESSORS = frozenset({
    "RepetitionPenaltyLogitsProcessor", "EncoderRepetitionPenaltyLogitsProcessor", "NoRepeatNGramLogitsProcessor",
    "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "NoBadWordsLogitsProcessor",
    "SequenceBiasLogitsProcessor", "SuppressTokensLogitsProcessor", "SuppressTokensAtBeginLogitsProcessor",
    "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor", "ExponentialDecayLengthPenalty",
    "PrefixConstrainedLogitsProcessor", "WatermarkLogitsProcessor",
})


# transformers' three attributes as the first patch found them. Kept after
# disable(): a generate() call that picked the patched method before another
# thread switched pld off still finishes through them.
_original: dict = {}
# DecodeConfig fields a generate() call sets from its generation_config;
# enable() takes the others.
_FROM_GENERATION_CONFIG = ("max_new_tokens", "prompt_lookup_num_tokens", "max_matching_ngram_size",
                           "eos_token_id", "do_sample", "temperature", "top_k", "top_p", "output_scores",
                           "output_logits")
# A prompt-lookup generate() call that leaves max_matching_ngram_size unset
# looks up n-grams of at most this size: transformers' default (its
# PromptLookupCandidateGenerator's), not DecodeConfig's 3.
TRANSFORMERS_MAX_MATCHING_NGRAM_SIZE = 2
_ENABLE_OPTIONS = tuple(n for n in DecodeConfig.option_names() if n not in _FROM_GENERATION_CONFIG)
# The native loop's options while enabled (enable()'s, over DecodeConfig's
# defaults); each call fills in what its generation_config says. Rebound,
# never changed in place: a call reads one set whatever another thread does.
_options: dict = {}
# An enabled() block's options, in the thread (or task) that runs it.
_block_options: contextvars.ContextVar = contextvars.ContextVar("pld_enabled_options", default=None)
# The switch's state, changed under _SWITCH: whether enable() holds pld on,
# and how many enabled() blocks run now (in any thread). transformers stays
# patched while either holds it.
_SWITCH = threading.RLock()
_held_on = False
_blocks: list = []  # each running block's options, oldest first


def _native_blocker(model: Any, input_ids: torch.Tensor, args: dict, model_kwargs: dict) -> Optional[str]:
    """Why the native loop cannot serve this call exactly, or None."""
    config = args["generation_config"]
    if config.prompt_lookup_num_tokens is None:
        return "not a prompt-lookup call"
    if args.get("assistant_model") is not None:
        return "an assistant model is set"
    generator = args.get("candidate_generator")
    if generator is not None and not isinstance(generator, PromptLookupCandidateGenerator):
        return f"candidate generator {type(generator).__name__}"
    for flag in ("assistant_early_exit", "use_mtp"):
        if getattr(config, flag, None):
            return f"generation_config.{flag} is set"
    no_cache = cache_blocker(model)  # (an encoder-decoder model among the reasons)
    if no_cache is not None:
        return f"{type(model).__name__} cannot be served by pld's loop: {no_cache}"
    if input_ids.shape[0] != 1:
        if args.get("streamer") is not None:
            return f"a streamer with batch size {input_ids.shape[0]}"
        if config.return_dict_in_generate and (config.output_scores or config.output_logits):
            return f"output_scores/output_logits with batch size {input_ids.shape[0]}"
    if args.get("synced_gpus"):
        return "synced_gpus"
    if config.output_attentions or config.output_hidden_states:
        return "output_attentions/output_hidden_states"
    extra = sorted(k for k, v in model_kwargs.items() if v is not None and k not in _NATIVE_MODEL_KWARGS)
    if extra:
        return f"model inputs {extra}"
    cache = _generate_cache(model_kwargs)
    if cache is None:
        if config.use_cache is False:
            return "use_cache=False"
        # (transformers 5.0.0 makes no cache for assisted decoding: the model makes its own
        # DynamicCache, as the loop does)
    elif not hasattr(cache, "get_seq_length"):
        return f"cache {type(cache).__name__} is not a transformers Cache"
    elif cache.get_seq_length() != 0:
        return "the cache already holds tokens"
    mask = model_kwargs.get("attention_mask")
    if mask is not None and mask.shape != input_ids.shape:
        return "attention_mask does not match input_ids"
    if mask is not None and input_ids.shape[0] == 1:
        try:  # (pld's loop reads a mask as attend or not; a batch's, decide checks, as pld.generate's)
            check_mask(input_ids, mask)
        except ValueError as error:
            return str(error)
    position_ids = model_kwargs.get("position_ids")
    if position_ids is not None and not _default_positions(input_ids, model_kwargs.get("attention_mask"),
                                                          position_ids):
        return "position_ids other than the attention mask's"
    criteria = _criteria_blocker(config, args["stopping_criteria"], input_ids.shape[0])
    if criteria is not None:
        return criteria
    if input_ids.shape[0] > 1:
        stateful = sorted({type(p).__name__ for p in args["logits_processor"]
                           if type(p).__name__ not in ROW_WISE_PROCESSORS | STATELESS_PROCESSORS})
        if stateful:
            return f"logits processors {stateful} with batch size {input_ids.shape[0]}"
    if config.max_length is not None and config.max_length > MAX_INDEX_TOKENS:
        return f"max_length {config.max_length} is beyond the index's limit of {MAX_INDEX_TOKENS} tokens"
    return None


def _default_positions(input_ids: torch.Tensor, mask: Any, position_ids: Any) -> bool:
    """Whether ``position_ids`` are those the loop gives the prompt: each
    attended token's count of attended tokens before it."""
    if not isinstance(position_ids, torch.Tensor) or tuple(position_ids.shape) != tuple(input_ids.shape):
        return False
    attended = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask.bool()
    expected = attended.long().cumsum(-1) - 1
    return bool((position_ids.to(expected.device)[attended] == expected[attended]).all())


def _criteria_blocker(config: Any, criteria: Any, batch: int) -> Optional[str]:
    """Why the loop cannot apply ``criteria`` as generate() does, or None.
    The loop applies eos_token_id and max_length itself; a criterion of
    those kinds set for other ids, or a criterion of a kind it does not
    know, is applied per row at each position (:func:`_run`), which is
    generate()'s rule for one row. In a batch generate() hands a criterion
    every row at once, and without an eos id it writes tokens on after a
    row stops (it pads only where an eos criterion is set)."""
    eos = set(_eos_ids(config))
    for c in criteria:
        name = type(c).__name__
        if name == "EosTokenCriteria" and set(_eos_ids(c)) != eos:
            return "an EosTokenCriteria for other ids than eos_token_id"
        if name in _NATIVE_CRITERIA:
            continue
        if batch > 1 and (name not in _BATCHED_CRITERIA or not eos):
            why = "without an eos_token_id" if name in _BATCHED_CRITERIA else "a stopping criterion"
            return f"{name} {why} with batch size {batch}"
    return None


def _eos_ids(holder: Any) -> Tuple[int, ...]:
    """The eos ids of a generation config or an EosTokenCriteria."""
    ids = getattr(holder, "_eos_token_tensor", None)
    return eos_ids(getattr(holder, "eos_token_id", None) if ids is None else ids)


def _pld_assisted_decoding(self: Any, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    original = _original["_assisted_decoding"]
    bound = inspect.signature(original).bind(self, input_ids, *args, **kwargs)
    bound.apply_defaults()
    named = dict(bound.arguments)
    model_kwargs = dict(named.pop("model_kwargs", {}) or {})
    k = named["generation_config"].prompt_lookup_num_tokens
    if k is not None:  # the C core refuses a longer draft: say so with the caller's name, first
        check_size("prompt_lookup_num_tokens", k, 1, MAX_DRAFT_TOKENS, "the C core's limit on a draft")
    reason = _native_blocker(self, input_ids, named, model_kwargs)
    if reason is not None and _plain_decoding_serves(self, named) \
            and not _assisted_decoding_serves(self, input_ids, named, model_kwargs):
        logger.warning("pld: using transformers' decoding without prompt lookup (%s)", reason)
        if cache_blocker(self) is not None:
            model_kwargs = _plain_cache(self, model_kwargs)
        return self._sample(input_ids, logits_processor=named["logits_processor"],
                            stopping_criteria=named["stopping_criteria"], generation_config=named["generation_config"],
                            synced_gpus=named.get("synced_gpus", False), streamer=named.get("streamer"),
                            **model_kwargs)
    if reason is not None:
        logger.warning("pld: using transformers' assisted decoding (%s)", reason)
        return _within_max_length(original(self, input_ids, *args, **kwargs), named["generation_config"])

    config = named["generation_config"]
    if config.max_length <= input_ids.shape[1]:  # nothing to generate: plain decoding returns the prompt
        result = loop.LoopResult(sequences=input_ids, stats=loop.LoopStats(), scores=(), logits=(),
                                 past_key_values=_generate_cache(model_kwargs))
    else:
        result = _run(self, input_ids, named, model_kwargs)
    if named.get("streamer") is not None:
        named["streamer"].end()
    if not config.return_dict_in_generate:
        return result.sequences
    extra = {} if input_ids.shape[0] > 1 else {"scores": result.scores, "logits": result.logits}
    return _gen_utils.GenerateDecoderOnlyOutput(sequences=result.sequences, **extra,
                                                **{_OUTPUT_CACHE: result.past_key_values})


def _run(model: Any, input_ids: torch.Tensor, named: dict, model_kwargs: dict) -> Any:
    """pld.loop.run with the call's arguments: its options, its cache (none,
    or an empty one -- generate()'s default DynamicCache, a static one --
    leaves the loop to pick its own, which gives the same tokens; an
    OwnedCache is filled in place), mask,
    processors, criteria (a length criterion for another length than
    max_length is applied as a custom one), streamer and pad id."""
    from transformers import DynamicCache

    from .kv_cache import OwnedCache

    config = named["generation_config"]
    cache = _generate_cache(model_kwargs)
    if cache is not None and cache.get_seq_length() == 0 and not isinstance(cache, OwnedCache):
        if type(cache) is not DynamicCache:
            logger.info("pld: the loop keeps its own cache in place of the empty %s", type(cache).__name__)
        cache = None
    length = config.max_length
    criteria = [c for c in named["stopping_criteria"] if type(c).__name__ not in _NATIVE_CRITERIA
                or type(c).__name__ != "EosTokenCriteria" and getattr(c, "max_length", length) != length]
    return loop.run(model, input_ids, _decode_config(config, config.max_length - input_ids.shape[1]),
                    cache=cache, attention_mask=model_kwargs.get("attention_mask"),
                    logits_processor=named["logits_processor"], stopping_criteria=criteria,
                    streamer=named.get("streamer"), pad_token_id=_pad_id(config))


def _pld_validate_generation_mode(self: Any, generation_mode: Any, generation_config: Any, *args: Any,
                                  **kwargs: Any) -> Any:
    """transformers' checks of a generation mode, except for a prompt-lookup
    call: it may ask for num_return_sequences > 1 (generate() then repeats
    each prompt that many times, as for sampling, and pld's loop serves the
    batch, each row also drafting from its siblings: pld.drafts.siblings),
    and a stateful model's is checked as plain decoding (the replacement of
    ``_assisted_decoding`` decodes it plainly)."""
    original = _original["_validate_generation_mode"]
    mode_kwargs = args[0] if args else kwargs.get("generation_mode_kwargs") or {}
    if generation_config.prompt_lookup_num_tokens is not None and mode_kwargs.get("assistant_model") is None \
            and generation_mode == _gen_utils.GenerationMode.ASSISTED_GENERATION:
        if (getattr(generation_config, "num_return_sequences", 1) or 1) > 1:
            generation_config = copy.copy(generation_config)
            generation_config.num_return_sequences = 1
        if getattr(self, "_is_stateful", False):
            plain = "SAMPLE" if generation_config.do_sample else "GREEDY_SEARCH"
            generation_mode = getattr(_gen_utils.GenerationMode, plain)
    return original(self, generation_mode, generation_config, *args, **kwargs)


def _pad_id(config: Any) -> Any:
    """The id generate() fills finished rows with (its pad token, which it
    sets to the first eos id when the model has none)."""
    pad = getattr(config, "_pad_token_tensor", None)
    if isinstance(pad, torch.Tensor) and pad.numel():
        return int(pad.reshape(-1)[0])
    return config.pad_token_id


def _assisted_decoding_serves(model: Any, input_ids: torch.Tensor, named: dict, model_kwargs: dict) -> bool:
    """Whether transformers' assisted decoding serves a prompt-lookup call
    pld's loop cannot as exactly as plain decoding does: an encoder-decoder
    model's single row (the one kind it serves that pld's loop does not),
    without what a differential audit found it gets wrong on some release
    (4.57 to 5.24), each of which goes to plain decoding instead:
    - a batch, or a decoder-only model (any reason: a mask of other values
      than 0/1, an eos criterion for other ids, a length beyond the index);
    - use_cache=False, a cache that is not a dynamic one (static: crop
      fails) or already holds tokens (it refuses or fails);
    - per-token outputs (attentions, hidden states: a crash on 4.57 to
      5.3, too many on 4.57 to 5.10) and a streamer (given tokens past
      max_length on 4.57 to 5.10);
    - a stopping criterion other than the length, the time and the
      call's eos ids (checked only after a whole draft is accepted: it
      stops late);
    - decoder ids that end in an eos id, where the original checks its
      criteria on a draft before verifying it (``is_done_candidate``: 4.57
      to 5.17): BART starts its decoder at eos, and those stop before the
      first token."""
    config = named["generation_config"]
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False) or input_ids.shape[0] != 1:
        return False
    if config.use_cache is False or config.output_attentions or config.output_hidden_states \
            or named.get("streamer") is not None or named.get("synced_gpus"):
        return False
    eos = set(_eos_ids(config))
    for c in named["stopping_criteria"]:
        name = type(c).__name__
        if name not in _NATIVE_CRITERIA | {"MaxTimeCriteria"} \
                or name == "EosTokenCriteria" and set(_eos_ids(c)) != eos \
                or getattr(c, "max_length", config.max_length) != config.max_length:
            return False
    if int(input_ids[0, -1]) in eos and _checks_a_draft_before_verifying():
        return False
    if getattr(config, "cache_implementation", None) not in (None, "dynamic"):
        return False
    cache = _generate_cache(model_kwargs)
    if cache is None:
        return True
    layers = getattr(cache, "self_attention_cache", cache)
    return type(layers).__name__ == "DynamicCache" and cache.get_seq_length() == 0


@functools.lru_cache(maxsize=1)
def _checks_a_draft_before_verifying() -> bool:
    """Whether transformers' assisted decoding asks the stopping criteria
    about a draft before verifying it (``is_done_candidate``), and so
    stops at once on ids that end in an eos id; True where its source
    cannot be read."""
    try:
        return "is_done_candidate" in inspect.getsource(_original.get("_assisted_decoding",
                                                                      _gen_utils.GenerationMixin._assisted_decoding))
    except (OSError, TypeError):
        return True


def _plain_cache(model: Any, model_kwargs: dict) -> dict:
    """``model_kwargs`` with the empty DynamicCache generate() made for
    assisted decoding (a full-layer one: transformers 5.10 and later lay
    it out without the model's config) replaced by the one plain decoding
    makes (:func:`pld.kv_cache.dynamic_cache`), which a hybrid or
    compressing model's layers need."""
    from transformers import DynamicCache

    from .kv_cache import dynamic_cache

    cache = _generate_cache(model_kwargs)
    try:
        if type(cache) is not DynamicCache or cache.get_seq_length() != 0:
            return model_kwargs
    except ValueError:  # (5.24: a cache of linear-attention layers only, laid out for the model already)
        return model_kwargs
    return {k: dynamic_cache(model) if v is cache else v for k, v in model_kwargs.items()}


def _plain_decoding_serves(model: Any, named: dict) -> bool:
    """Whether a call pld's loop cannot serve is a prompt-lookup call that
    transformers' plain decoding (``_sample``: greedy or sampling) serves
    as generate() would without prompt lookup: not one for an assistant,
    a candidate generator, or transformers' early-exit or MTP drafts
    (those keep transformers' assisted decoding)."""
    config = named["generation_config"]
    return config.prompt_lookup_num_tokens is not None \
        and named.get("assistant_model") is None and named.get("candidate_generator") is None \
        and not any(getattr(config, flag, None) for flag in ("assistant_early_exit", "use_mtp")) \
        and callable(getattr(model, "_sample", None))


def _generate_cache(model_kwargs: dict) -> Any:
    """The cache generate() made (5.24 and later keep it as ``cache``,
    earlier releases as ``past_key_values``)."""
    cache = model_kwargs.get("cache")
    return cache if cache is not None else model_kwargs.get("past_key_values")


def _decode_config(config: Any, budget: int) -> DecodeConfig:
    """The native loop's options for a generate() call: enable()'s, and what
    its generation_config asks for. A max_matching_ngram_size it leaves
    unset (None, or 0) is transformers' default, 2, as generate() gives its
    own PromptLookupCandidateGenerator (not DecodeConfig's 3) -- or
    enable()'s min_ngram_size where that is larger."""
    options = _current_options()
    unset = max(TRANSFORMERS_MAX_MATCHING_NGRAM_SIZE, options.get("min_ngram_size", 1))
    return DecodeConfig(**{
        **options,
        "max_matching_ngram_size": config.max_matching_ngram_size or unset,
        "max_new_tokens": budget,
        "prompt_lookup_num_tokens": config.prompt_lookup_num_tokens,
        "eos_token_id": getattr(config, "_eos_token_tensor", None),
        "do_sample": bool(config.do_sample),  # (its warpers come as logits processors)
        "output_scores": bool(config.return_dict_in_generate and config.output_scores),
        "output_logits": bool(config.return_dict_in_generate and config.output_logits),
    })


def _within_max_length(output: Any, config: Any) -> Any:
    """Some transformers releases (4.57) let an accepted draft run past
    max_length; plain decoding never does, so neither does pld."""
    limit = config.max_length
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    if limit is None or sequences.shape[1] <= limit:
        return output
    if isinstance(output, torch.Tensor):
        return output[:, :limit]
    extra = sequences.shape[1] - limit
    output.sequences = sequences[:, :limit]
    for name in ("scores", "logits", "attentions", "hidden_states"):
        value = getattr(output, name, None)
        if isinstance(value, tuple) and len(value) >= extra:
            setattr(output, name, value[:len(value) - extra])
    return output


def enable(**options: Any) -> None:
    """Route prompt-lookup generation through pld (idempotent), for the
    whole process, until :func:`disable` (safe to call from any thread;
    see :func:`enabled` for a block's own options).

    ``options`` are :class:`pld.config.DecodeConfig` fields that a
    generate() call does not set itself (``cost_aware``, ``linear_kernel``,
    ``adaptive``, ``policy``, ``min_ngram_size``, ``semantics``); they are
    validated now and hold until the next enable() or disable(). The call
    itself gives the draft length (``prompt_lookup_num_tokens``) and the
    largest n-gram (``max_matching_ngram_size``; unset: 2, transformers'
    default, where pld.generate's is 3; or ``min_ngram_size`` if larger).

    ``cost_aware`` (default on): the native loop verifies the draft tokens
    whose expected gain pays for the wider forward (pld.width_budget: the
    forward cost measured on the model, the acceptance learned during the
    generation); on a GPU, or on a CPU with the oneDNN kernel, it lets
    nearly all through; with torch's default kernel on a CPU it skips weak
    1-gram matches. Off: every draft is verified, as transformers does.
    The output is the same either way.

    ``linear_kernel`` (default ``"auto"``): while the native loop runs, a
    float32 model on the CPU computes its linear layers with oneDNN, which
    reads the weights once for a few tokens, where torch's default kernel
    makes a verification forward cost several one-token forwards
    (:mod:`pld.cpu_kernels`); ``"torch"`` keeps torch's kernel."""
    _renamed.translate(options, _renamed.DECODE_CONFIG, "pld.enable()")
    _enable(options)


def _checked_options(options: dict, caller: str) -> dict:
    """``options`` (deprecated names already translated) as a new dict,
    after DecodeConfig checks them: a TypeError or ValueError naming them."""
    refused = sorted(set(options) - set(_ENABLE_OPTIONS))
    if refused:
        raise TypeError(f"{caller} got options {refused}; it takes {_ENABLE_OPTIONS} (a "
                        "generate() call sets the others from its generation_config: "
                        "model.generate(..., prompt_lookup_num_tokens=k, max_matching_ngram_size=n))")
    DecodeConfig(**options)  # validated now, with the caller's names
    return dict(options)


def _current_options() -> dict:
    """The options of the enabled() block this thread (or task) runs in;
    in a thread outside any block (a worker a block started, as for a
    streamer), those of the newest block running; else enable()'s."""
    block = _block_options.get()
    if block is None and _blocks:
        with _SWITCH:
            block = _blocks[-1] if _blocks else None
    return _options if block is None else block


def _enable(options: dict) -> None:
    """enable() with the deprecated names already translated."""
    global _options, _held_on
    options = _checked_options(options, "enable()")
    with _SWITCH:
        _options, _held_on = options, True
        _patch()


def _patch() -> None:
    """Put pld's three attributes in transformers (under _SWITCH; idempotent)."""
    if is_enabled():
        return
    _original["PromptLookupCandidateGenerator"] = _gen_utils.PromptLookupCandidateGenerator
    _original["_assisted_decoding"] = _gen_utils.GenerationMixin._assisted_decoding
    _original["_validate_generation_mode"] = _gen_utils.GenerationMixin._validate_generation_mode
    _gen_utils.PromptLookupCandidateGenerator = PromptLookupCandidateGenerator
    _gen_utils.GenerationMixin._assisted_decoding = _pld_assisted_decoding
    _gen_utils.GenerationMixin._validate_generation_mode = _pld_validate_generation_mode


def _unpatch() -> None:
    """Put transformers' three attributes back where pld's are still in
    place (under _SWITCH; idempotent)."""
    if _gen_utils.PromptLookupCandidateGenerator is PromptLookupCandidateGenerator:
        _gen_utils.PromptLookupCandidateGenerator = _original["PromptLookupCandidateGenerator"]
    mixin = _gen_utils.GenerationMixin
    if mixin._assisted_decoding is _pld_assisted_decoding:
        mixin._assisted_decoding = _original["_assisted_decoding"]
    if mixin._validate_generation_mode is _pld_validate_generation_mode:
        mixin._validate_generation_mode = _original["_validate_generation_mode"]


def disable() -> None:
    """Switch off what enable() switched on, and restore transformers
    exactly as it was once no enabled() block runs in any thread
    (idempotent). A call already running keeps the method it picked."""
    global _options, _held_on
    with _SWITCH:
        _options, _held_on = {}, False
        if not _blocks:
            _unpatch()


def is_enabled() -> bool:
    """Whether pld is switched on now: a plain function returning a bool
    (``if pld.is_enabled(): ...``). Not to be confused with
    :func:`enabled`, the context manager that switches it on for a block."""
    return _gen_utils.GenerationMixin._assisted_decoding is _pld_assisted_decoding


@contextlib.contextmanager
def enabled(**options: Any) -> Iterator[None]:
    """A context manager that switches pld on for a ``with`` block
    (``with pld.enabled(): model.generate(..., prompt_lookup_num_tokens=10)``;
    options as for :func:`enable`). The options hold, in place of
    enable()'s, for the calls the block makes in its own thread (or
    asyncio task), and for calls from threads that run in no block (a
    worker the block started, as for a streamer: the newest block's).
    Blocks in other threads may overlap it, each with its own options;
    pld stays on until the last one ends (for good if enable() was called,
    within a block or not; disable() takes effect once none runs). It
    does not answer whether pld is on: that is
    :func:`is_enabled` (``if pld.enabled():`` is always true, as any
    object is)."""
    # (stacklevel: the warning names the `with` line, through contextlib's __enter__)
    _renamed.translate(options, _renamed.DECODE_CONFIG, "pld.enabled()", stacklevel=3)
    mine = _checked_options(options, "enabled()")
    token = _block_options.set(mine)
    try:
        with _SWITCH:
            _blocks.append(mine)
            _patch()
        try:
            yield
        finally:
            with _SWITCH:
                _blocks.remove(mine)  # (an equal dict of another block would do as well)
                if not _blocks and not _held_on:
                    _unpatch()
    finally:
        _block_options.reset(token)
