"""pld.generate: the prompt-lookup loop without model.generate()."""
from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Union

import torch

from . import _core, loop
from .render import render_steps


@dataclass
class Generation:
    """The output of pld.generate."""

    sequences: torch.Tensor   # [1, prompt + new]
    prompt_length: int
    stats: loop.LoopStats

    @property
    def new_tokens(self) -> List[int]:
        return self.sequences[0, self.prompt_length:].tolist()

    def render(self, tokenizer: Any, mode: str = "auto") -> str:
        """The output with every multi-token step coloured: ``"ansi"`` for a
        terminal, ``"html"`` for a notebook, ``"plain"``, or ``"auto"``."""
        return render_steps(tokenizer, [r.tokens for r in self.stats.records], mode)


def _is_index(value: Any) -> bool:
    """An integer in Python's sense (__index__: int, NumPy integers), not a bool."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _eos_ids(value: Any) -> List[int]:
    """eos_token_id as a list of ids: None, an int (a NumPy integer, a 0-d
    tensor), or a list/tuple/array/tensor of them, as transformers takes it."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(f"eos_token_id: expected integer ids, got a {value.dtype} tensor")
        return [int(v) for v in value.reshape(-1).tolist()]
    if _is_index(value):
        return [operator.index(value)]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"eos_token_id: expected an int or a list of ints, got {type(value).__name__}")
    ids = list(value)
    bad = [v for v in ids if not _is_index(v)]
    if bad:
        raise TypeError(f"eos_token_id: expected a list of ints, got an item of type {type(bad[0]).__name__}")
    return [operator.index(v) for v in ids]


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


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def _number(name: str, value: Any, integer: bool = False) -> Any:
    """None, or a real number (an int for ``integer``), not a bool."""
    if value is None:
        return None
    if integer:
        if not _is_index(value):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        return operator.index(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    return float(value)


def _warpers(temperature: Optional[float], top_k: Optional[int], top_p: Optional[float]) -> list:
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

    out: list = []
    if temperature is not None and temperature != 1.0:
        out.append(TemperatureLogitsWarper(temperature))
    if top_k is not None and top_k > 0:
        out.append(TopKLogitsWarper(top_k))
    if top_p is not None and top_p < 1.0:
        out.append(TopPLogitsWarper(top_p))
    return out


def generate(
    model: Any,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int = 128,
    num_pred_tokens: int = 10,
    max_ngram_size: int = 3,
    min_ngram_size: int = 1,
    policy: str = "first",
    do_sample: bool = False,
    temperature: Optional[float] = None,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    eos_token_id: Union[None, int, Sequence[int]] = -1,
    attention_mask: Optional[torch.Tensor] = None,
    logits_processor: Optional[Sequence[Any]] = None,
    stopping_criteria: Optional[Sequence[Any]] = None,
    streamer: Any = None,
    on_step: Optional[Callable[[loop.StepRecord], None]] = None,
    cost_aware: bool = True,
    linear_kernel: str = "auto",
) -> Generation:
    """Generate with prompt lookup on a decoder-only transformers model.

    Greedy (``do_sample=False``) gives exactly the tokens of greedy
    decoding (in float32; half precision can flip near-ties because the
    verification forward is wider). Sampling keeps the model's distribution.
    ``eos_token_id`` defaults to the model's generation config; pass None to
    run to ``max_new_tokens``. ``on_step`` receives every step's
    StepRecord (proposed, accepted, tokens) as it happens. ``cost_aware``
    drops drafts from match sizes that have not paid for their verification
    on this machine (:class:`pld.draft_length.CostGate`; greedy only); the
    output is the same either way. ``linear_kernel`` picks the matrix
    product of the model's linear layers during the run
    (:mod:`pld.linear_kernel`: ``"auto"`` uses oneDNN for a float32 model
    on the CPU, ``"torch"`` torch's own).

    Memory follows the output: the buffers grow as tokens come, so a large
    ``max_new_tokens`` costs nothing when eos comes early. Sizes take any
    int (NumPy integers too, not bools): ``max_new_tokens`` >= 1 with
    prompt + max_new_tokens <= 2**32 - 3, ``num_pred_tokens`` <= 2**20 (the
    C core's limits). ``eos_token_id`` may be an int, a list, a NumPy
    integer or a tensor; ``attention_mask`` a tensor, list or array shaped
    [L] or [1, L]. A wrong type raises an error naming the argument. A model
    that keeps no KV cache (its forward takes no ``past_key_values``, or it
    leaves the cache it is given empty) raises a ValueError naming it.
    """
    from transformers import DynamicCache

    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids: expected a torch tensor of token ids ([L] or [1, L]), got "
                        f"{type(input_ids).__name__} (pass torch.tensor(ids))")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids: expected shape [L] or [1, L], got {tuple(input_ids.shape)}")
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"input_ids: batch size {input_ids.shape[0]} is not supported; pld.generate runs one "
            "sequence at a time (run the rows one by one)")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids: the prompt is empty")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids: expected integer ids, got {input_ids.dtype}")
    prompt_len = input_ids.shape[1]
    max_new_tokens = loop.check_size(
        "max_new_tokens", max_new_tokens, 1, loop.MAX_INDEX_TOKENS - prompt_len,
        f"prompt + max_new_tokens is at most {loop.MAX_INDEX_TOKENS} tokens, the index's limit")
    num_pred_tokens = loop.check_size("num_pred_tokens", num_pred_tokens, 1, loop.MAX_DRAFT_TOKENS,
                                      "the C core's limit on a draft")
    max_ngram_size = loop.check_size("max_ngram_size", max_ngram_size, 1, _core.MAX_NGRAM)
    min_ngram_size = loop.check_size("min_ngram_size", min_ngram_size, 1, _core.MAX_NGRAM)
    do_sample = _flag("do_sample", do_sample)
    cost_aware = _flag("cost_aware", cost_aware)
    temperature = _number("temperature", temperature)
    top_k = _number("top_k", top_k, integer=True)
    top_p = _number("top_p", top_p)
    processors = _callables("logits_processor", logits_processor)
    criteria = _callables("stopping_criteria", stopping_criteria)
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step: expected a callable or None, got {type(on_step).__name__}")
    if streamer is not None and not (callable(getattr(streamer, "put", None))
                                     and callable(getattr(streamer, "end", None))):
        raise TypeError(f"streamer: expected an object with put() and end() (a transformers streamer), "
                        f"got {type(streamer).__name__}")
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise ValueError("model: encoder-decoder models are not supported; pld needs a decoder-only model")
    if not callable(model) or not callable(getattr(model, "parameters", None)):
        raise TypeError(f"model: expected a transformers causal LM (a torch.nn.Module), got {type(model).__name__}")
    reason = loop.cache_blocker(model)
    if reason is not None:
        raise ValueError(f"model: {type(model).__name__} cannot be used by pld.generate: {reason}; "
                         "prompt lookup verifies drafts against a KV cache it crops "
                         "(use plain model.generate() for this model)")
    if _is_index(eos_token_id) and operator.index(eos_token_id) == -1:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = _eos_ids(eos_token_id)
    if attention_mask is not None:
        attention_mask = _mask(attention_mask, input_ids)
    if do_sample:
        processors += _warpers(temperature, top_k, top_p)
    elif temperature is not None or top_k is not None or top_p is not None:
        raise ValueError("temperature/top_k/top_p need do_sample=True")
    device = next(iter(model.parameters()), input_ids).device
    if streamer is not None:  # the streamer protocol of generate(): the prompt first
        streamer.put(input_ids.cpu())
    with torch.no_grad():
        result = loop.run(
            model,
            input_ids.to(device=device, dtype=torch.long),
            cache=DynamicCache(),
            max_new_tokens=max_new_tokens,
            num_pred_tokens=num_pred_tokens,
            max_ngram_size=max_ngram_size,
            min_ngram_size=min_ngram_size,
            policy=policy,
            eos_token_ids=eos,
            attention_mask=None if attention_mask is None else attention_mask.to(device),
            logits_processor=processors,
            stopping_criteria=criteria,
            do_sample=do_sample,
            streamer=streamer,
            on_step=on_step,
            record_steps=True,
            cost_aware=cost_aware,
            linear_kernel=linear_kernel,
        )
    if streamer is not None:
        streamer.end()
    return Generation(sequences=result.sequences, prompt_length=prompt_len, stats=result.stats)
