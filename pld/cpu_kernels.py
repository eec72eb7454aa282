"""CPU kernels for pld's loop: a model's linear layers on oneDNN, grouped-query
attention over shared key/value heads.

:func:`cpu_kernels` is the one entry point (the adapter's ``kernels()``,
pld.hf_adapter). It enters this machinery only for a model whose parameters
are on the CPU; for any other device (a GPU, ``meta``) it runs nothing: no
probe, no timing, no patch. Nothing runs at import: the oneDNN and SDPA
probes run on first use.

Linear layers (:class:`LinearKernel`). A verification forward over 1 + k
tokens pays only if it costs about a one-token forward. torch's float32
``nn.Linear`` calls MKL, whose small-M products on AMD cores cost about M
matrix-vector products; oneDNN's (``torch.ops.mkldnn._linear_pointwise``)
reads each weight once. On Intel cores MKL can be the faster one, so
``"auto"`` times both on the model's own layers (:func:`onednn_pays`) and
routes only where oneDNN is clearly faster. The two sum in different
orders: logits differ in the last bits, greedy outputs only where two
logits tie to within float32 rounding. The README has the measurements.

Shared heads (:func:`shared_kv_heads`). With a mask and several query
tokens, transformers' SDPA attention copies the cached keys and values once
per query head of a group (``repeat_kv``); torch's CPU SDPA takes the shared
heads (``enable_gqa=True``), bit for bit the same. The switch makes
transformers take that path for several-token queries on CPU tensors.

Threads: each patch (a layer's instance ``forward``, transformers'
``use_gqa_in_sdpa``) is installed when the first block using it enters, in
any thread, and removed exactly when the last one leaves (also by an
exception); in between it acts only in the threads (asyncio tasks:
contexts) inside a block, and everywhere else torch and transformers behave
as their own. Blocks nest.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import threading
import time
import types
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import LINEAR_KERNELS

#: The token widths "auto" times: a one-token step and a verification forward.
WIDTHS = (1, 9)
#: "auto" routes only when oneDNN takes at most this share of torch's time,
#: so that timing noise cannot flip a close call between runs.
MARGIN = 0.9
#: "auto"'s measured decisions kept (layer shapes and thread count -> routes),
#: the least recently used dropped first.
MAX_DECISIONS = 64
_DECISIONS: "collections.OrderedDict[Tuple, bool]" = collections.OrderedDict()
# Guards _DECISIONS, the oneDNN probe, the routed layers' use counts and the
# shared-heads switch's installation.
_LOCK = threading.Lock()
# Per layer: how many routing() blocks (in any thread) route it now.
_LAYER_USERS: "weakref.WeakKeyDictionary[nn.Linear, int]" = weakref.WeakKeyDictionary()
# The layers this thread (asyncio task: context) routes now: id -> blocks.
_ROUTED: contextvars.ContextVar[Dict[int, int]] = contextvars.ContextVar("pld_linear_routed", default={})
# How many shared_kv_heads() blocks this context is inside.
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("pld_shared_kv_heads", default=0)
# Blocks inside shared_kv_heads() in any thread, and the function in place
# before the first of them entered.
_SWITCH_USERS = 0
_ORIGINAL: Optional[Callable[..., bool]] = None
_OP: Any = None
_PROBED = False


@contextlib.contextmanager
def cpu_kernels(model: Any, linear_kernel: str = "auto") -> Iterator[None]:
    """For a model whose parameters are on the CPU: its linear layers on the
    product ``linear_kernel`` picks (:class:`LinearKernel`) and attention
    over shared heads (:func:`shared_kv_heads`) inside the block. For a
    model elsewhere it does nothing at all."""
    if not _on_cpu(model):
        yield
        return
    with LinearKernel(model, linear_kernel).routing(), shared_kv_heads():
        yield


def _on_cpu(model: Any) -> bool:
    """Whether the model says it is on the CPU (``model.device``, else its
    first parameter's device); False for a model without parameters."""
    device = getattr(model, "device", None)
    if not isinstance(device, torch.device):
        first = next(iter(model.parameters()), None) if isinstance(model, nn.Module) else None
        device = None if first is None else first.device
    return device is not None and device.type == "cpu"


# -- linear layers --------------------------------------------------------------

def onednn_available() -> bool:
    """Whether this torch build offers a float32 oneDNN linear that agrees
    with F.linear on a probe (run once, on first use)."""
    global _OP, _PROBED
    with _LOCK:
        if not _PROBED:
            _OP, _PROBED = _onednn_op(), True
    return _OP is not None


def _onednn_op() -> Optional[Any]:
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None
    if op is None:
        return None
    try:
        gen = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(*shape, generator=gen) for shape in ((1, 3, 16), (8, 16), (8,)))
        if not torch.allclose(op(x, w, b, "none", [], ""), F.linear(x, w, b), atol=1e-5):
            return None
    except (RuntimeError, TypeError):
        return None
    return op


class LinearKernel:
    """Route ``model``'s float32 CPU ``nn.Linear`` layers through oneDNN
    inside :meth:`routing`.

    ``mode``: ``"auto"`` routes when the model has such layers, oneDNN
    works and it is measured faster on them (:func:`onednn_pays`);
    ``"onednn"`` demands it (ValueError when it cannot be had);
    ``"torch"`` never routes. :attr:`active` says whether routing will take
    place, :attr:`reason` why not.
    """

    def __init__(self, model: Any, mode: str = "auto") -> None:
        if mode not in LINEAR_KERNELS:
            raise ValueError(f"linear_kernel: expected one of {LINEAR_KERNELS}, got {mode!r}")
        self.layers: List[nn.Linear] = []
        self.reason = ""
        if mode == "torch":
            self.reason = "linear_kernel='torch'"
        elif not onednn_available():
            self.reason = "this torch build has no working oneDNN linear"
        else:
            self.layers = [m for m in model.modules() if _routable(m)] \
                if isinstance(model, nn.Module) else []
            if not self.layers:
                self.reason = "the model has no float32 nn.Linear on the CPU"
            elif mode == "auto" and not onednn_pays(self.layers):
                self.layers = []
                self.reason = "torch's product is faster for this model's layers here (measured)"
        if mode == "onednn" and not self.layers:
            raise ValueError(f"linear_kernel='onednn' cannot be used: {self.reason}")

    @property
    def active(self) -> bool:
        return bool(self.layers)

    @contextlib.contextmanager
    def routing(self) -> Iterator[None]:
        """While active, the routed layers compute with oneDNN in this
        context; on exit (also by an exception) it is torch's product again.
        A layer gets its routed forward (an instance attribute shadowing
        nn.Linear.forward) when the first block routing it enters, in any
        thread, and loses it when the last one leaves."""
        if not self.layers:
            yield
            return
        _enter_layers(self.layers)
        try:
            yield
        finally:
            _leave_layers(self.layers)


def _enter_layers(layers: List[nn.Linear]) -> None:
    with _LOCK:
        for layer in layers:
            n = _LAYER_USERS.get(layer, 0)
            if n == 0:
                layer.__dict__["forward"] = types.MethodType(_routed_forward, layer)
            _LAYER_USERS[layer] = n + 1
    # a fresh dict: contexts copied from this one keep what they saw
    routed = dict(_ROUTED.get())
    for layer in layers:
        routed[id(layer)] = routed.get(id(layer), 0) + 1
    _ROUTED.set(routed)


def _leave_layers(layers: List[nn.Linear]) -> None:
    """Undo :func:`_enter_layers` (tolerates an exit in another context)."""
    routed = dict(_ROUTED.get())
    for layer in layers:
        n = routed.pop(id(layer), 0) - 1
        if n > 0:
            routed[id(layer)] = n
    _ROUTED.set(routed)
    with _LOCK:
        for layer in layers:
            n = _LAYER_USERS.pop(layer, 0) - 1
            if n > 0:
                _LAYER_USERS[layer] = n
            else:
                layer.__dict__.pop("forward", None)


def _routable(m: Any) -> bool:
    # exactly nn.Linear: subclasses (quantized, LoRA, ...) have their own
    # forward; so has a layer with an instance forward, unless it is ours
    # (another thread's block routes it now)
    own = vars(m).get("forward") if isinstance(m, nn.Module) else None
    return (type(m) is nn.Linear and m.weight.device.type == "cpu"
            and m.weight.dtype == torch.float32
            and (m.bias is None or m.bias.dtype == torch.float32)
            and (own is None or getattr(own, "__func__", None) is _routed_forward))


def _routed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The forward of a routed layer: oneDNN (read at call time, so a test
    can wrap it) where this context routes the layer, else torch's."""
    if x.dtype != torch.float32 or id(self) not in _ROUTED.get():
        return nn.Linear.forward(self, x)
    return _OP(x, self.weight, self.bias, "none", [], "")


def onednn_pays(layers: List[nn.Linear]) -> bool:
    """Whether oneDNN computes ``layers`` clearly faster than torch's own
    product (at most MARGIN of its time) over the WIDTHS of a prompt-lookup
    step; measured once per process for each set of layer shapes and
    thread count (the last MAX_DECISIONS of them kept, least recently
    used dropped first; safe across threads)."""
    key = (tuple((tuple(m.weight.shape), m.bias is not None) for m in layers), torch.get_num_threads())
    with _LOCK:
        if key in _DECISIONS:
            _DECISIONS.move_to_end(key)
            return _DECISIONS[key]
    # measured outside the lock (it runs products); the first decision
    # stored wins, so threads that measured at once agree
    t_torch, t_onednn = measure(layers)
    with _LOCK:
        routes = _DECISIONS.setdefault(key, t_onednn <= MARGIN * t_torch)
        _DECISIONS.move_to_end(key)
        while len(_DECISIONS) > MAX_DECISIONS:
            _DECISIONS.popitem(last=False)
    return routes


def measure(layers: List[nn.Linear], repeats: int = 3) -> Tuple[float, float]:
    """(torch, oneDNN): seconds for one pass over ``layers`` at every width
    in WIDTHS with each product, the best of ``repeats`` after a warm-up,
    the two alternating. A pass reads every weight as a forward does.
    torch's global RNG is left alone (a private generator)."""
    gen = torch.Generator().manual_seed(0)
    inputs = {(w, m.in_features): torch.randn(1, w, m.in_features, generator=gen)
              for w in WIDTHS for m in layers}
    kernels = {"torch": lambda x, m: F.linear(x, m.weight, m.bias),
               "onednn": lambda x, m: _OP(x, m.weight, m.bias, "none", [], "")}
    best = {name: float("inf") for name in kernels}
    with torch.no_grad():
        for r in range(repeats + 1):
            for name in (list(kernels) if r % 2 else list(kernels)[::-1]):
                t0 = time.perf_counter()
                for w in WIDTHS:
                    for m in layers:
                        kernels[name](inputs[(w, m.in_features)], m)
                if r:  # round 0 warms up (oneDNN packs a weight on its first use)
                    best[name] = min(best[name], time.perf_counter() - t0)
    return best["torch"], best["onednn"]


# -- shared key/value heads ---------------------------------------------------

@functools.lru_cache(maxsize=None)
def _torch_has_gqa() -> bool:
    """Whether torch's SDPA takes ``enable_gqa`` (a builtin without a
    signature to read: asked once, on first use)."""
    q, kv = torch.zeros(1, 2, 2, 4), torch.zeros(1, 1, 2, 4)
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


def _switch(original: Callable[..., bool]) -> Callable[..., bool]:
    """transformers' ``use_gqa_in_sdpa`` that also says yes -- only in a
    context inside :func:`shared_kv_heads` -- for several-token queries
    with a 4-D mask over CPU tensors; ``original``'s answer elsewhere."""

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


@contextlib.contextmanager
def shared_kv_heads() -> Iterator[bool]:
    """While active, transformers' SDPA attention passes shared key/value
    heads to torch (``enable_gqa``) instead of copying them, for queries of
    several tokens with a mask on CPU tensors; everything else keeps
    transformers' own choice. Yields whether the switch is in place (False
    when this torch or transformers has no such path)."""
    global _SWITCH_USERS, _ORIGINAL
    module = _sdpa_module()
    if module is None or not _torch_has_gqa():
        yield False
        return
    with _LOCK:
        if _SWITCH_USERS == 0:
            _ORIGINAL = module.use_gqa_in_sdpa
            module.use_gqa_in_sdpa = _switch(_ORIGINAL)
        _SWITCH_USERS += 1
    _DEPTH.set(_DEPTH.get() + 1)
    try:
        yield True
    finally:
        # not a reset(token): it would refuse an exit in another context
        _DEPTH.set(max(_DEPTH.get() - 1, 0))
        with _LOCK:
            _SWITCH_USERS -= 1
            if _SWITCH_USERS == 0:
                module.use_gqa_in_sdpa, _ORIGINAL = _ORIGINAL, None
