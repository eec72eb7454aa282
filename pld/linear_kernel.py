"""The matrix product behind a model's linear layers while pld decodes.

A prompt-lookup step verifies 1 + k tokens in one forward. That pays only
if a forward over a few tokens costs about what a one-token forward costs:
both should read every weight once, and the extra arithmetic is small. On a
GPU it does. On a CPU it depends on the kernel. torch's float32
``nn.Linear`` calls MKL, whose small-M products run far below the
arithmetic peak of AMD cores (a product over M tokens can cost about M
matrix-vector products), so a verification forward costs several one-token
forwards and prompt lookup barely pays (the README has the measurements:
"Why less than the method's 2.4x here"). oneDNN's
float32 product (``torch.ops.mkldnn._linear_pointwise``, the kernel torch's
own compiler uses for frozen linears) reads the weights once at these
widths, and on such cores its one-token products are faster than MKL's too.
On other CPUs (Intel cores, where MKL's small products are good) it can be
the slower one, so ``"auto"`` measures: it routes only when oneDNN is
clearly faster on the model's own layers at the widths a prompt-lookup
step uses (see :func:`onednn_pays`).

:class:`LinearKernel` routes a model's plain float32 CPU ``nn.Linear``
layers through oneDNN while :meth:`LinearKernel.routing` is active, in the
thread that is inside it (another thread using the same model meanwhile
gets torch's product). pld's native loop runs inside it
(``linear_kernel="auto"``). The two kernels sum
in different orders, so logits differ from torch's default in the last
bits, as torch's own one-token and many-token products already differ from
each other; greedy outputs stay identical unless two logits tie to within
float32 rounding (the test suite checks identity on real prompts). Part of
pld's speed on such a CPU is then the kernel's, not prompt lookup's: the
benchmark's ``greedy_onednn`` method (plain greedy inside the same routing)
shows which part.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import threading
import time
import types
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

MODES = ("auto", "onednn", "torch")
#: The token widths "auto" times: a one-token step and a verification forward.
WIDTHS = (1, 9)
#: "auto" routes only when oneDNN takes at most this share of torch's time,
#: so that timing noise cannot flip a close call between runs.
MARGIN = 0.9
#: "auto"'s measured decisions kept (layer shapes and thread count -> routes),
#: the least recently used dropped first.
MAX_DECISIONS = 64
_DECISIONS: "collections.OrderedDict[Tuple, bool]" = collections.OrderedDict()
# Guards _DECISIONS, the oneDNN probe and the routed layers' use counts.
_LOCK = threading.Lock()
# Per layer: how many routing() blocks (in any thread) route it now.
_USERS: "weakref.WeakKeyDictionary[nn.Linear, int]" = weakref.WeakKeyDictionary()
# The layers this thread (asyncio task: context) routes now: id -> blocks.
_ROUTED: contextvars.ContextVar[Dict[int, int]] = contextvars.ContextVar("pld_linear_routed", default={})


def _onednn_op() -> Optional[Any]:
    """The oneDNN linear op when this torch build has it and it agrees with
    F.linear on a probe; None otherwise."""
    if not torch.backends.mkldnn.is_available():
        return None
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    if op is None:
        return None
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(1, 3, 16, generator=gen)
        w = torch.randn(8, 16, generator=gen)
        b = torch.randn(8, generator=gen)
        if not torch.allclose(op(x, w, b, "none", [], ""), F.linear(x, w, b), atol=1e-5):
            return None
    except (RuntimeError, TypeError):
        return None
    return op


_OP: Any = None
_PROBED = False


def onednn_available() -> bool:
    """Whether this torch build offers a working oneDNN float32 linear."""
    global _OP, _PROBED
    with _LOCK:
        if not _PROBED:
            _OP, _PROBED = _onednn_op(), True
    return _OP is not None


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
        if mode not in MODES:
            raise ValueError(f"linear_kernel: expected one of {MODES}, got {mode!r}")
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
        thread; on exit (also by an exception) it is torch's product again.

        Safe across threads and kernels: a layer gets its routed forward
        when the first block routing it enters (in any thread) and loses
        it, exactly, when the last one leaves; in between, the routed
        forward uses oneDNN only in the threads (asyncio tasks: contexts)
        inside a block that routes that layer, and torch's own forward
        everywhere else (a plain ``model.generate`` in another thread).
        Blocks nest."""
        if not self.layers:
            yield
            return
        _acquire(self.layers)
        _enter_thread(self.layers)
        try:
            yield
        finally:
            _leave_thread(self.layers)
            _release(self.layers)


def _acquire(layers: List[nn.Linear]) -> None:
    """One more block routes ``layers``: the first gives each its routed
    forward, an instance attribute that shadows nn.Linear.forward
    (nn.Module.__call__ looks it up on the instance)."""
    with _LOCK:
        for layer in layers:
            n = _USERS.get(layer, 0)
            if n == 0:
                layer.__dict__["forward"] = types.MethodType(_routed_forward, layer)
            _USERS[layer] = n + 1


def _release(layers: List[nn.Linear]) -> None:
    """One block fewer routes ``layers``: the last one removes the routed
    forward (torch's class forward shows through again)."""
    with _LOCK:
        for layer in layers:
            n = _USERS.pop(layer, 0) - 1
            if n > 0:
                _USERS[layer] = n
            else:
                layer.__dict__.pop("forward", None)


def _enter_thread(layers: List[nn.Linear]) -> None:
    """Mark ``layers`` routed in this context (a fresh dict: contexts copied
    from this one keep what they saw)."""
    routed = dict(_ROUTED.get())
    for layer in layers:
        routed[id(layer)] = routed.get(id(layer), 0) + 1
    _ROUTED.set(routed)


def _leave_thread(layers: List[nn.Linear]) -> None:
    """Undo :func:`_enter_thread` (tolerates an exit in another context)."""
    routed = dict(_ROUTED.get())
    for layer in layers:
        n = routed.pop(id(layer), 0) - 1
        if n > 0:
            routed[id(layer)] = n
    _ROUTED.set(routed)


def _is_routed_forward(forward: Any) -> bool:
    return getattr(forward, "__func__", None) is _routed_forward


def _routable(m: Any) -> bool:
    # exactly nn.Linear: subclasses (quantized, LoRA, ...) have their own
    # forward; so has a layer with an instance forward, unless it is ours
    # (another thread's block routes it now)
    own = vars(m).get("forward") if isinstance(m, nn.Module) else None
    return (type(m) is nn.Linear and m.weight.device.type == "cpu"
            and m.weight.dtype == torch.float32
            and (m.bias is None or m.bias.dtype == torch.float32)
            and (own is None or _is_routed_forward(own)))


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
    the two alternating. A pass reads every weight as a forward does."""
    # a private generator: torch's global RNG state is the caller's (a
    # seeded sampling run must repeat whether or not this ran first)
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

