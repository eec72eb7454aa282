"""What a forward over w new tokens costs, measured on this machine and model.

A token-tree step verifies W draft tokens (plus the pending one) in one
forward. Whether a wider tree pays depends on c(w): the time of a forward
over w new tokens at the current context, in units of a one-token forward.
On a GPU c grows slowly (the weights are read once whatever w is); on a CPU
it grows quickly (the arithmetic grows with w). :class:`ForwardCost` holds
c(w) measured on the model itself (:func:`calibrate`), interpolated
between the measured widths.

Calibration happens before a generation's first drafted step and the table
is then frozen for that generation (and kept for the model, per context
size class), so a step's choice of width never reads the clock: seeded
sampling repeats exactly.

On a GPU a forward returns once its kernels are queued, not run: a clock
read then times the launches. :func:`measure` therefore waits for the
device (``synchronize``, from :func:`synchronizer`) before every clock
read.
"""
from __future__ import annotations

import bisect
import collections
import threading
import time
import weakref
from typing import Any, Callable, Optional, Sequence, Tuple

#: Widths (new tokens a forward) the calibration times (a caller adds its
#: widest). Few, since each is timed on the model itself: c is nearly
#: linear between them.
WIDTHS = (1, 2, 8, 16, 32, 64)
#: Timings per width; the fastest one counts (noise only ever adds time,
#: and a table is kept for the model: a load spike must not set it).
REPEATS = 3


class ForwardCost:
    """c(w) for w >= 1 from timings at ``widths`` (seconds, any unit),
    normalised so that c(1) = 1, made non-decreasing, interpolated linearly
    between widths and extended past the widest one along its last slope."""

    def __init__(self, widths: Sequence[int], seconds: Sequence[float]) -> None:
        if len(widths) != len(seconds) or not widths or widths[0] != 1:
            raise ValueError("widths: expected increasing widths from 1, one time each")
        if any(b <= a for a, b in zip(widths, widths[1:])):
            raise ValueError("widths: expected increasing widths from 1, one time each")
        if any(not s > 0 for s in seconds):
            raise ValueError("seconds: every time must be positive")
        unit = seconds[0]
        costs, top = [], 0.0
        for s in seconds:
            top = max(top, s / unit)  # a wider forward never costs less
            costs.append(top)
        self.widths: Tuple[int, ...] = tuple(int(w) for w in widths)
        self.costs: Tuple[float, ...] = tuple(costs)

    def __call__(self, w: int) -> float:
        """c(w), in one-token forwards (w >= 1)."""
        ws, cs = self.widths, self.costs
        if w <= 1:
            return 1.0
        i = bisect.bisect_left(ws, w)
        if i < len(ws) and ws[i] == w:
            return cs[i]
        if i == len(ws):  # past the widest: the last slope
            if len(ws) == 1:
                return cs[0] * w
            slope = (cs[-1] - cs[-2]) / (ws[-1] - ws[-2])
            return cs[-1] + slope * (w - ws[-1])
        a, b = ws[i - 1], ws[i]
        return cs[i - 1] + (cs[i] - cs[i - 1]) * (w - a) / (b - a)

    def __repr__(self) -> str:
        pairs = ", ".join(f"{w}: {c:.2f}" for w, c in zip(self.widths, self.costs))
        return f"ForwardCost({{{pairs}}})"


def synchronizer(device: Any) -> Optional[Callable[[], None]]:
    """What waits for the work queued on ``device`` (a torch.device or its
    name): ``torch.cuda.synchronize`` for a CUDA device (and the like for
    XPU and MPS), None for the CPU, whose forwards return when done."""
    import torch

    device = torch.device(device)
    backend = {"cuda": getattr(torch, "cuda", None), "xpu": getattr(torch, "xpu", None),
               "mps": getattr(torch, "mps", None)}.get(device.type)
    if backend is None:
        return None
    if device.type == "mps":
        return backend.synchronize
    return lambda: backend.synchronize(device)


def measure(forward: Callable[[int], Any], widths: Sequence[int] = WIDTHS,
            repeats: int = REPEATS, clock: Callable[[], float] = time.perf_counter,
            warm_up: bool = True, synchronize: Optional[Callable[[], None]] = None) -> ForwardCost:
    """Time ``forward(w)`` (a forward over w new tokens that leaves the
    model's state as it found it) ``repeats`` times at each width, widths
    interleaved, and keep each width's fastest time. ``warm_up`` first
    runs the widest once, untimed, to pay for allocations (no need when the
    model has just run a forward at least as wide). ``synchronize`` (None
    on the CPU) waits for the device before each clock read, so that a
    time is the forward's work, not its launch."""
    import torch

    wait = synchronize if synchronize is not None else _nothing

    global _calibrating
    best = [float("inf")] * len(widths)
    with _LOCK:
        _calibrating += 1
    # eval-mode forwards draw nothing; fork_rng keeps torch's CPU RNG state
    # the caller's even for a model that does (a seeded run must repeat)
    try:
        with torch.random.fork_rng(devices=[]):
            if warm_up:
                forward(widths[-1])
            for _ in range(repeats):
                for j, w in enumerate(widths):
                    wait()
                    t0 = clock()
                    forward(w)
                    wait()
                    best[j] = min(best[j], clock() - t0)
    finally:
        with _LOCK:
            _calibrating -= 1
    return ForwardCost(widths, [max(s, 1e-9) for s in best])


def _nothing() -> None:
    pass


_calibrating = 0
# Guards _calibrating and _TABLES.
_LOCK = threading.Lock()


def calibrating() -> bool:
    """Whether a calibration is running (its forwards are not decoding
    steps: the benchmark's forward counter leaves them out)."""
    return _calibrating > 0


# Calibrations kept per model: key (context size class, ...) -> ForwardCost,
# least recently used first; at most MAX_TABLES_PER_MODEL a model.
_TABLES: "weakref.WeakKeyDictionary[Any, collections.OrderedDict[Tuple, ForwardCost]]" = \
    weakref.WeakKeyDictionary()
#: Calibrations kept for one model; the least recently used goes first.
MAX_TABLES_PER_MODEL = 16


def size_class(context: int) -> int:
    """Contexts within a factor of 4 share a calibration: 0 below 256
    tokens, then 1 for [256, 1024), 2 for [1024, 4096), ..."""
    c, edge = 0, 256
    while context >= edge:
        c, edge = c + 1, edge * 4
    return c


def cached_or_measure(model: Any, key: Tuple, forward: Callable[[int], Any],
                      widths: Sequence[int] = WIDTHS, warm_up: bool = True,
                      clock: Callable[[], float] = time.perf_counter,
                      synchronize: Optional[Callable[[], None]] = None) -> ForwardCost:
    """The model's table for ``key`` (its context size class, dtype, device,
    kernels...), measured with ``forward`` (timed by ``clock``, after
    ``synchronize``) the first time it is asked for. Keeps the MAX_TABLES_PER_MODEL most recently used
    tables of each model (a model that cannot be weakly referenced keeps
    none: measured every time). Safe across threads: the measuring runs
    outside the lock, and when two threads measure one key at once the
    first table stored is the one both get."""
    with _LOCK:
        tables = _tables_of(model)
        table = tables.get(key) if tables is not None else None
        if table is not None:
            tables.move_to_end(key)
            return table
    measured = measure(forward, widths, clock=clock, warm_up=warm_up, synchronize=synchronize)
    if tables is None:
        return measured
    with _LOCK:
        table = tables.setdefault(key, measured)
        tables.move_to_end(key)
        while len(tables) > MAX_TABLES_PER_MODEL:
            tables.popitem(last=False)
    return table


def _tables_of(model: Any) -> "Optional[collections.OrderedDict[Tuple, ForwardCost]]":
    """``model``'s kept tables (created empty), or None for a model that
    cannot be weakly referenced. The caller holds _LOCK."""
    try:
        return _TABLES.setdefault(model, collections.OrderedDict())
    except TypeError:
        return None


def tables(model: Any) -> "collections.OrderedDict[Tuple, ForwardCost]":
    """A copy of the tables kept for ``model``, least recently used first."""
    with _LOCK:
        try:
            return collections.OrderedDict(_TABLES.get(model, {}))
        except TypeError:  # not weakly referenceable: nothing is kept for it
            return collections.OrderedDict()


def forget(model: Any) -> None:
    """Drop the calibrations kept for ``model`` (the next generation measures again)."""
    with _LOCK:
        _TABLES.pop(model, None)
