"""pld.generate: the prompt-lookup loop without model.generate()."""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from . import _renamed, loop
from .batch_inputs import check_left_padded, check_mask
from .hf_adapter import cache_blocker
from .config import DecodeConfig
from .render import render_steps


@dataclass
class Generation:
    """The output of pld.generate. For a batch, ``sequences`` is [B, prompt
    + longest output] with shorter rows filled with the pad id (as batched
    ``model.generate`` returns them) and ``rows`` each row's new tokens.
    ``scores`` / ``logits`` (one row, with ``output_scores`` /
    ``output_logits``; else None): generate()'s, one [1, V] tensor a new
    token, the processed scores the token was chosen from / the model's
    raw logits."""

    sequences: torch.Tensor   # [B, prompt + new]
    prompt_length: int
    stats: loop.LoopStats
    rows: Optional[List[List[int]]] = None
    scores: Optional[Tuple[torch.Tensor, ...]] = None
    logits: Optional[Tuple[torch.Tensor, ...]] = None

    @property
    def new_tokens(self) -> Any:
        """The new tokens: a list of ids, or for a batch a list per row
        (without the filling)."""
        if self.rows is not None:
            return self.rows
        return self.sequences[0, self.prompt_length:].tolist()

    def render(self, tokenizer: Any, mode: str = "auto") -> str:
        """The output with every multi-token step coloured: ``"ansi"`` for a
        terminal, ``"html"`` for a notebook, ``"plain"``, or ``"auto"``."""
        return render_steps(tokenizer, [r.tokens for r in self.stats.records], mode)


def _mask(value: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """attention_mask as a [1, L] tensor: a tensor, a list/tuple or a NumPy
    array of 0/1, shaped [L] or [1, L] like input_ids."""
    if not isinstance(value, torch.Tensor):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise TypeError(f"attention_mask: expected a tensor (or a list/array of 0/1), got {type(value).__name__}")
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"attention_mask: cannot be made a tensor ({e})") from None
    if value.dtype.is_complex:
        raise TypeError(f"attention_mask: expected 0/1 values, got a {value.dtype} tensor")
    if value.is_meta:
        raise ValueError("attention_mask: a tensor on the meta device holds no values")
    if value.dim() == 1:
        value = value[None]
    if tuple(value.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask: expected the shape of input_ids {tuple(input_ids.shape)}, "
                         f"got {tuple(value.shape)}")
    return value


def _callables(name: str, value: Any) -> list:
    """A list of callables (a LogitsProcessorList, a StoppingCriteriaList...)."""
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name}: expected a list of callables, got {type(value).__name__}")
    items = list(value)
    for i, item in enumerate(items):
        if not callable(item):
            raise TypeError(f"{name}[{i}]: expected a callable, got {type(item).__name__}")
    return items


def generate(
    model: Any,
    input_ids: torch.Tensor,
    config: Optional[DecodeConfig] = None,
    *,
    attention_mask: Any = None,
    logits_processor: Optional[Sequence[Any]] = None,
    stopping_criteria: Optional[Sequence[Any]] = None,
    streamer: Any = None,
    on_step: Optional[Callable[[loop.StepRecord], None]] = None,
    **options: Any,
) -> Generation:
    """Generate with prompt lookup on a decoder-only transformers model.

    The options are :class:`pld.config.DecodeConfig`'s, as keywords
    (``max_new_tokens=128, prompt_lookup_num_tokens=10,
    max_matching_ngram_size=3, do_sample, temperature, eos_token_id``...)
    or as a ``config`` (the old ``num_pred_tokens``/``max_ngram_size`` work
    for one release, with a DeprecationWarning). Greedy (``do_sample=False``) gives exactly the
    tokens of greedy decoding (in float32; half precision can flip
    near-ties because the verification forward is wider). Sampling keeps
    the model's distribution. ``eos_token_id`` defaults to the model's
    generation config; pass None to run to ``max_new_tokens``. ``on_step``
    receives every step's StepRecord (proposed, accepted, tokens) as it
    happens. ``cost_aware`` (default on) verifies the draft tokens whose
    expected gain pays for the wider forward on this machine
    (pld.width_budget); the output is the same either way. Memory follows
    the output. ``attention_mask``: a tensor, list or array like input_ids;
    without one, generate()'s is inferred (the prompt's pad tokens masked
    where the model's generation config names a pad id that is not an eos
    id). A wrong type or value (an id beyond the model's vocabulary among
    them), or a model without a KV cache or in training mode with dropout,
    raises an error naming the argument.
    """
    _renamed.translate(options, _renamed.DECODE_CONFIG, "pld.generate()")
    if config is not None and not isinstance(config, DecodeConfig):
        raise TypeError(f"config: expected a pld.DecodeConfig (or None, with options as keywords), got "
                        f"{type(config).__name__}")
    config = (config or DecodeConfig()).replace(**options)
    input_ids = _prompt(input_ids)
    processors = _callables("logits_processor", logits_processor)
    criteria = _callables("stopping_criteria", stopping_criteria)
    if input_ids.shape[0] > 1 and (config.output_scores or config.output_logits):
        raise ValueError("output_scores/output_logits: not supported for a batch (batch size "
                         f"{input_ids.shape[0]}); pass one row")
    ids, mask = _checked_inputs(model, input_ids, attention_mask, streamer, on_step)
    if mask is None:
        mask = _mask_from_padding(model, ids, config.with_model_eos(model).eos_token_id)
    if streamer is not None:  # the streamer protocol of generate(): the prompt first, end() last
        streamer.put(input_ids.cpu())
    with torch.no_grad():
        result = loop.run(model, ids, config, attention_mask=mask, logits_processor=processors,
                          stopping_criteria=criteria, streamer=streamer, on_step=on_step)
    if streamer is not None:
        streamer.end()
    return Generation(sequences=result.sequences, prompt_length=input_ids.shape[1], stats=result.stats,
                      rows=result.rows if input_ids.shape[0] > 1 else None, scores=result.scores,
                      logits=result.logits)


def _checked_inputs(model: Any, input_ids: torch.Tensor, attention_mask: Any, streamer: Any,
                    on_step: Any) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(ids, mask) on the model's device, after the model, the callbacks and
    the mask are checked (an error naming the argument otherwise)."""
    _check_callbacks(streamer, on_step)
    _check_model(model)
    if input_ids.shape[0] > 1 and (streamer is not None or on_step is not None):
        raise ValueError("streamer/on_step: not supported for a batch (batch size "
                         f"{input_ids.shape[0]}); pass one row, or neither")
    _check_vocabulary(model, input_ids)
    device = next(iter(model.parameters()), input_ids).device
    mask = None if attention_mask is None else _mask(attention_mask, input_ids).to(device)
    return input_ids.to(device=device, dtype=torch.long), mask


def _check_vocabulary(model: Any, input_ids: torch.Tensor) -> None:
    """No id below 0 or beyond the model's vocabulary (the larger of its
    input embedding's rows and its config's vocab_size, where either can
    be read), or a ValueError naming input_ids (the embedding would raise
    an IndexError, or read out of bounds on a device)."""
    sizes = [getattr(getattr(model, "config", None), "vocab_size", None)]
    try:
        weight = getattr(model.get_input_embeddings(), "weight", None)
        sizes.append(weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None)
    except Exception:  # noqa: BLE001 - a model whose embedding transformers cannot find (NotImplementedError)
        pass
    sizes = [n for n in sizes if isinstance(n, int) and not isinstance(n, bool)]
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or (sizes and high >= max(sizes)):
        bound = f"[0, {max(sizes)}) (the model's vocabulary)" if sizes else ">= 0"
        raise ValueError(f"input_ids: token ids must be in {bound}, got {low if low < 0 else high}")


def _mask_from_padding(model: Any, input_ids: torch.Tensor, eos: Any) -> Optional[torch.Tensor]:
    """The mask generate() infers where it is given none: the prompt's pad
    tokens masked where the model's generation config names a pad id that
    is not one of ``eos`` (the run's eos ids) and the prompt holds it; None
    (every token attended) otherwise."""
    pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    if not isinstance(pad, int) or isinstance(pad, bool) or pad in (eos or ()):
        return None
    is_pad = input_ids == pad
    if not bool(is_pad.any()):
        return None
    mask = (~is_pad).long()
    try:
        check_left_padded(input_ids, mask) if input_ids.shape[0] > 1 else check_mask(input_ids, mask)
    except ValueError as error:
        raise ValueError(f"input_ids: the prompt holds the model's pad id {pad}, which generate() masks where "
                         f"no attention_mask is given (pass one to say otherwise): {error}") from None
    return mask


def _prompt(input_ids: Any) -> torch.Tensor:
    """input_ids as a [B, L] integer tensor, or an error naming it."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids: expected a torch tensor of token ids ([L] or [B, L]), got "
                        f"{type(input_ids).__name__} (pass torch.tensor(ids))")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids: expected shape [L] or [B, L], got {tuple(input_ids.shape)}")
    if input_ids.shape[0] == 0:
        raise ValueError("input_ids: the batch is empty (batch size 0)")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids: the prompt is empty")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids: expected integer ids, got {input_ids.dtype}")
    if input_ids.is_meta:
        raise ValueError("input_ids: a tensor on the meta device holds no ids")
    return input_ids


def _check_callbacks(streamer: Any, on_step: Any) -> None:
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step: expected a callable or None, got {type(on_step).__name__}")
    if streamer is not None and not (callable(getattr(streamer, "put", None))
                                     and callable(getattr(streamer, "end", None))):
        raise TypeError(f"streamer: expected an object with put() and end() (a transformers streamer), "
                        f"got {type(streamer).__name__}")


def _check_model(model: Any) -> None:
    """A decoder-only torch model that keeps a KV cache, or an error naming it."""
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise ValueError("model: encoder-decoder models are not supported; pld needs a decoder-only model")
    if not callable(model) or not callable(getattr(model, "parameters", None)):
        raise TypeError(f"model: expected a transformers causal LM (a torch.nn.Module), got {type(model).__name__}")
    reason = cache_blocker(model)
    if reason is not None:
        raise ValueError(f"model: {type(model).__name__} cannot be used by pld.generate: {reason}; "
                         "prompt lookup verifies drafts against a KV cache it crops "
                         "(use plain model.generate() for this model)")


def _with_options_in_signature(fn: Callable) -> Callable:
    """fn's signature for help() and editors: its **options spelled out as
    DecodeConfig's fields (declared there, once)."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                 annotation=f.type)
               for f in dataclasses.fields(DecodeConfig)]
    fn.__signature__ = sig.replace(parameters=params)
    return fn


_with_options_in_signature(generate)
