"""pld.generate: the prompt-lookup loop without model.generate()."""
from __future__ import annotations

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
    """
    from transformers import DynamicCache

    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids: expected a torch tensor, got {type(input_ids).__name__}")
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
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise ValueError("model: encoder-decoder models are not supported; pld needs a decoder-only model")
    reason = loop.cache_blocker(model)
    if reason is not None:
        raise ValueError(f"model: {type(model).__name__} cannot be used by pld.generate: {reason}; "
                         "prompt lookup verifies drafts against a KV cache it crops "
                         "(use plain model.generate() for this model)")
    if eos_token_id == -1:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = [] if eos_token_id is None else ([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
    processors = list(logits_processor or [])
    if do_sample:
        processors += _warpers(temperature, top_k, top_p)
    elif temperature is not None or top_k is not None or top_p is not None:
        raise ValueError("temperature/top_k/top_p need do_sample=True")
    device = next(model.parameters()).device
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
            stopping_criteria=stopping_criteria,
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
