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
README. The switch is process-wide (transformers' module function) but
acts only in the threads inside the block, so concurrent generations, with
or without pld, each get what they asked for.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F


@functools.lru_cache(maxsize=None)
def _torch_has_gqa() -> bool:
    """Whether torch's SDPA takes ``enable_gqa`` (a builtin: no signature to
    read, so ask it, once, on first use: nothing runs at import)."""
    q = torch.zeros(1, 2, 2, 4)
    kv = torch.zeros(1, 1, 2, 4)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except (TypeError, RuntimeError):
        return False
    return True



def _sdpa_module() -> Optional[Any]:
    """transformers' SDPA integration, when it asks ``use_gqa_in_sdpa``."""
    try:
        from transformers.integrations import sdpa_attention
    except ImportError:
        return None
    return sdpa_attention if callable(getattr(sdpa_attention, "use_gqa_in_sdpa", None)) else None


# How many shared_kv_heads() blocks this thread (or asyncio task) is inside;
# the installed switch acts only where it is above 0.
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("pld_shared_kv_heads", default=0)
# The process-wide installation: how many blocks are active in any thread,
# and the function that was in place before the first of them entered.
_LOCK = threading.Lock()
_USERS = 0
_ORIGINAL: Optional[Callable[..., bool]] = None


def _switch(original: Callable[..., bool]) -> Callable[..., bool]:
    """transformers' ``use_gqa_in_sdpa`` that also says yes -- only in a
    thread inside :func:`shared_kv_heads` -- for several-token queries with
    a 4-D mask over CPU tensors; ``original``'s answer everywhere else."""

    # transformers 4.57 asks (attention_mask, key), 5.x (attention_mask, key, value)
    def use_gqa_in_sdpa(attention_mask: Any, key: Any, *rest: Any) -> bool:
        if original(attention_mask, key, *rest):
            return True
        if _DEPTH.get() <= 0:
            return False
        value = rest[0] if rest else key
        return (type(key) is torch.Tensor and type(value) is torch.Tensor
                and key.device.type == "cpu" and value.device.type == "cpu"
                and key.shape[-1] == value.shape[-1]
                and isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4
                and attention_mask.shape[-2] > 1)

    return use_gqa_in_sdpa


def _install(module: Any) -> None:
    """One more active block: the first one puts the switch in place."""
    global _USERS, _ORIGINAL
    with _LOCK:
        if _USERS == 0:
            _ORIGINAL = module.use_gqa_in_sdpa
            module.use_gqa_in_sdpa = _switch(_ORIGINAL)
        _USERS += 1


def _uninstall(module: Any) -> None:
    """One block fewer: the last one puts the original function back."""
    global _USERS, _ORIGINAL
    with _LOCK:
        _USERS -= 1
        if _USERS == 0:
            module.use_gqa_in_sdpa, _ORIGINAL = _ORIGINAL, None


@contextlib.contextmanager
def shared_kv_heads() -> Iterator[bool]:
    """While active, transformers' SDPA attention passes shared key/value
    heads to torch (``enable_gqa``) instead of copying them, for queries of
    several tokens with a mask on CPU tensors; everything else keeps
    transformers' own choice. Yields whether the switch is in place (False
    when this torch or transformers has no such path).

    Safe across threads: the switch is installed in transformers' module
    when the first block (in any thread) enters and the original function
    is put back, exactly, when the last one leaves (also by an exception);
    in between, it acts only in threads (asyncio tasks: contexts) that are
    inside a block, so another thread keeps transformers' behaviour. Blocks
    nest."""
    module = _sdpa_module()
    if module is None or not _torch_has_gqa():
        yield False
        return
    _install(module)
    _DEPTH.set(_DEPTH.get() + 1)
    try:
        yield True
    finally:
        # not a reset(token): it would refuse an exit in another context
        _DEPTH.set(max(_DEPTH.get() - 1, 0))
        _uninstall(module)
