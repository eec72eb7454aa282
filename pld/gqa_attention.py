"""Grouped-query attention without copying the cache in verification forwards.

Most current decoder models share each key/value head among several query
heads (grouped-query attention: Llama 3, Mistral, Qwen, SmolLM2). When a
forward's attention needs a mask -- and a forward over several new tokens
does -- transformers' SDPA attention first copies every layer's cached
keys and values once per query head of a group (``repeat_kv``), so a
verification forward copies the whole cache several times: a cost that
grows with the context, paid at every step (a one-token forward avoids it).
torch's CPU ``scaled_dot_product_attention`` takes the shared heads
directly (``enable_gqa=True``) with a mask, bit for bit the same result.

:func:`shared_kv_heads` makes transformers take that path for multi-token
queries on CPU tensors while it is active; pld's loop runs inside it (the
adapter's ``kernels()``, pld.hf_adapter). It changes no number: the test
suite checks the logits are identical. What it saves is measured in the
README.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F


def _torch_has_gqa() -> bool:
    """Whether torch's SDPA takes ``enable_gqa`` (a builtin: no signature to
    read, so ask it)."""
    q = torch.zeros(1, 2, 2, 4)
    kv = torch.zeros(1, 1, 2, 4)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except (TypeError, RuntimeError):
        return False
    return True


_TORCH_HAS_GQA = _torch_has_gqa()


def _sdpa_module() -> Optional[Any]:
    """transformers' SDPA integration, when it asks ``use_gqa_in_sdpa``."""
    try:
        from transformers.integrations import sdpa_attention
    except ImportError:
        return None
    return sdpa_attention if callable(getattr(sdpa_attention, "use_gqa_in_sdpa", None)) else None


@contextlib.contextmanager
def shared_kv_heads() -> Iterator[bool]:
    """While active, transformers' SDPA attention passes shared key/value
    heads to torch (``enable_gqa``) instead of copying them, for queries of
    several tokens with a mask on CPU tensors; everything else keeps
    transformers' own choice. Yields whether the switch is in place (False
    when this torch or transformers has no such path)."""
    module = _sdpa_module()
    if module is None or not _TORCH_HAS_GQA:
        yield False
        return
    original = module.use_gqa_in_sdpa

    # transformers 4.57 asks (attention_mask, key), 5.x (attention_mask, key, value)
    def use_gqa_in_sdpa(attention_mask: Any, key: Any, *rest: Any) -> bool:
        if original(attention_mask, key, *rest):
            return True
        value = rest[0] if rest else key
        return (type(key) is torch.Tensor and type(value) is torch.Tensor
                and key.device.type == "cpu" and value.device.type == "cpu"
                and key.shape[-1] == value.shape[-1]
                and isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4
                and attention_mask.shape[-2] > 1)

    module.use_gqa_in_sdpa = use_gqa_in_sdpa
    try:
        yield True
    finally:
        module.use_gqa_in_sdpa = original
