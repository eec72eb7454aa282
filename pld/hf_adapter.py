"""The decoding step's only view of a transformers causal LM.

:class:`TransformersAdapter` gives the step two things: ``forward(ids,
positions, mask, keep_last) -> logits`` over the tokens not yet cached, and
``truncate_cache(n)``. Everything transformers-specific the step needs
lives here: which keyword arguments the model's forward takes, the cache it
fills, the check that it filled it, and the two kernel choices that hold
while the loop runs (``kernels()``: oneDNN linear layers, grouped-query
attention over the cache's shared heads).
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator, Optional

import torch

from .gqa_attention import shared_kv_heads
from .kv_cache import no_dynamic_cache_reason
from .linear_kernel import LinearKernel


def _forward_accepts(model: Any, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _is_transformers_model(model: Any) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    return isinstance(model, PreTrainedModel)


def cache_blocker(model: Any) -> Optional[str]:
    """Why ``model`` cannot keep a cropped transformers cache for the loop,
    or None when it looks able to (checked again after the prefill)."""
    reason = no_dynamic_cache_reason(model)
    if reason is not None:
        return reason
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


class TransformersAdapter:
    """A transformers causal LM and the KV cache it fills, for one generation.

    ``cache`` is an empty transformers cache with ``crop`` (a DynamicCache).
    The adapter counts what the cache holds (``cached``); after the first
    forward it checks that the model filled the cache it was given, and
    with ``check_cache`` after every truncation that the cache holds
    exactly the tokens the step kept.
    """

    def __init__(self, model: Any, cache: Any, linear_kernel: str = "auto",
                 check_cache: bool = False) -> None:
        self.model = model
        self.cache = cache
        self.cached = 0
        self.forwards = 0
        self.check_cache = check_cache
        self._kernel = LinearKernel(model, linear_kernel)
        self._wants_cache_position = _forward_accepts(model, "cache_position")
        self._wants_logits_to_keep = _forward_accepts(model, "logits_to_keep")
        if hasattr(cache, "activate_past_recording"):
            cache.activate_past_recording()

    @contextlib.contextmanager
    def kernels(self) -> Iterator[None]:
        """The kernel choices of the run: the model's linear layers on the
        chosen matrix product, grouped-query attention over shared heads."""
        with self._kernel.routing(), shared_kv_heads():
            yield

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                keep_last: int) -> torch.Tensor:
        """Logits [keep_last, V] of the last ``keep_last`` of ``ids`` ([1, m],
        the tokens after the cached ones), whose positions are
        ``positions`` ([1, m]) and whose attention mask over the whole
        sequence so far is ``mask`` ([1, cached + m]). The cache then holds
        cached + m tokens."""
        m = ids.shape[1]
        inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions,
                  "past_key_values": self.cache, "use_cache": True}
        if self._wants_cache_position:
            inputs["cache_position"] = torch.arange(self.cached, self.cached + m, device=ids.device)
        if self._wants_logits_to_keep:
            inputs["logits_to_keep"] = keep_last
        out = self.model(**inputs)
        if self.forwards == 0:
            self._check_prefill(out, self.cached + m)
        self.forwards += 1
        self.cached += m
        return out.logits[0, -keep_last:]

    def truncate_cache(self, n: int) -> None:
        """Keep the first ``n`` cached tokens (n <= cached)."""
        drop = self.cached - n
        if drop > 0:
            self.cache.crop(-drop)
        self.cached = n
        self._check_held(n)

    def keep_cache(self, m: int, offsets: list) -> None:
        """Of the newest ``m`` cached tokens keep those at ``offsets``
        (increasing), moved after the older ones: a token tree's accepted
        path (the cache needs ``keep_last``: pld.kv_cache.OwnedCache)."""
        self.cache.keep_last(m, offsets)
        self.cached = self.cached - m + len(offsets)
        self._check_held(self.cached)

    def _check_held(self, n: int) -> None:
        if self.check_cache:
            held = self.cache.get_seq_length()
            if held != n:
                raise RuntimeError(f"pld: after a step the KV cache holds {held} tokens, the loop "
                                   f"counts {n} cached tokens")

    def _check_prefill(self, out: Any, expected: int) -> None:
        """After the first forward the cache must hold every token fed to it: a
        model that ignores ``past_key_values`` (or keeps its own cache) would
        otherwise see only the newest tokens in the next step."""
        name = type(self.model).__name__
        if getattr(out, "past_key_values", None) is None:
            raise ValueError(
                f"model: {name} returned no past_key_values from its forward; pld's loop needs a model "
                "that fills the KV cache it is given (use plain model.generate() for this model)")
        held = self.cache.get_seq_length()
        if held != expected:
            raise ValueError(
                f"model: {name} did not fill the KV cache passed as past_key_values (it holds {held} "
                f"tokens after a forward over {expected}); pld's loop needs a model that uses the cache "
                "it is given (use plain model.generate() for this model)")
