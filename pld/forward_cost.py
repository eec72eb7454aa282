"""What a forward over w new tokens costs, learned on this machine and model.

A step verifies W draft tokens (plus the pending one) in one forward.
Whether a wider step pays depends on c(w): the time of a forward over w new
tokens at the current context, in units of a one-token forward. On a GPU c
grows slowly (the weights are read once whatever w is); on a CPU it grows
quickly (the arithmetic grows with w), and how quickly depends on the
processor, its vector units, the kernels, the context and the load.

:class:`LearnedCost` learns c(w) from the forwards that decode: every
verification forward is a timed sample of t(w) at the current context. It
starts from two timed probe forwards (w = 1 and the widest a step may
use), then fits a line through the fastest time of each width among the
last :data:`WINDOW` forwards with drafts, and keeps the fastest recent
one-token forward, so a load spike is forgotten within WINDOW forwards.
One is kept per model and key (batch size, context size class, dtype,
device, kernel): a later generation goes on from what the
earlier ones learned, with no probe. The width choice reads it; greedy
tokens never depend on it, and a sampling row takes one uniform a token
drawn from its own stream whatever the drafts (pld.accept_walk.Uniforms),
so a seeded run still repeats its tokens.

On a GPU a forward returns once its kernels are queued, not run: a clock
read then times the launches. Every timed forward therefore waits for the
device (``synchronize``, from :func:`synchronizer`) before the clock is read.
:class:`ForwardCost` is a fixed table (the tests', and the "no budget" of
a prefill).
"""
from __future__ import annotations

import bisect
import collections
import contextlib
import threading
import time
import weakref
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple


class ForwardCost:
    """c(w) for w >= 1 from timings at ``widths`` (seconds, any unit),
    normalised so that c(1) = 1, made non-decreasing, interpolated linearly
    between widths and extended past the widest one along its last slope."""

    def __init__(self, widths: Sequence[int], seconds: Sequence[float]) -> None:
        if (len(widths) != len(seconds) or not widths or widths[0] != 1
                or any(b <= a for a, b in zip(widths, widths[1:]))):
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

    def observe(self, width: int, seconds: float) -> None:
        """A fixed table learns nothing from the forwards that run."""

    learns = False

    def __repr__(self) -> str:
        pairs = ", ".join(f"{w}: {c:.2f}" for w, c in zip(self.widths, self.costs))
        return f"ForwardCost({{{pairs}}})"


#: The timed forwards a learned cost keeps (oldest dropped): a load spike is
#: forgotten within this many forwards of the model at one key.
WINDOW = 32


#: One-token forwards a learned cost keeps, however old (see LearnedCost).
PLAIN_SAMPLES = 8


class LearnedCost:
    """c(w) of one model at one key, learned from timed forwards
    (:meth:`observe`). A forward with drafts pays a fixed cost over a
    one-token forward (on a CPU about 0.3 of one: another kernel shape,
    the masks) and then a little per token, so two things are learned:

    - the line t(w) = t2 + b (w - 2) for w >= 2: least squares through the
      fastest time of each width among the last :data:`WINDOW` samples
      (weighted by their counts), b >= 0; flat (b = 0) while the window
      holds one such width, so that the next wider step measures the slope;
    - t(1): the fastest of the last :data:`PLAIN_SAMPLES` one-token
      forwards, however old (a loop that drafts every step runs none).

    c(1) = 1 and c(w) = max(t(w) / t(1), 1). Load only ever adds time: a
    fastest time ignores a spike shorter than its width's samples in the
    window, and forgets any once it leaves the window; an old t(1), from a
    shorter context, can only make drafts look dearer. Safe across threads."""

    learns = True

    def __init__(self) -> None:
        self._samples: Deque[Tuple[int, float]] = collections.deque(maxlen=WINDOW)
        self._plain: Deque[float] = collections.deque(maxlen=PLAIN_SAMPLES)
        self._line = (1.0, 0.0)  # (t2, b)
        self._t1 = 1.0
        self._fitted = True
        self._lock = threading.Lock()

    def observe(self, width: int, seconds: float) -> None:
        """A forward over ``width`` new tokens took ``seconds``."""
        self.observe_many(((int(width), float(seconds)),))

    def observe_many(self, timed: Sequence[Tuple[int, float]]) -> None:
        """:meth:`observe` for each (width, seconds) in turn, an int and a
        float each: what the windows keep of them, the last WINDOW samples
        and the last PLAIN_SAMPLES one-token ones (a width below 1, or
        seconds not above 0, is no sample). Where the last WINDOW of
        ``timed`` are all samples and hold PLAIN_SAMPLES one-token ones,
        nothing before them is kept, and only they are read."""
        kept = [t for t in timed[-WINDOW:] if t[0] >= 1 and t[1] > 0]
        plain = [s for w, s in kept if w == 1]
        if len(timed) > WINDOW and (len(kept) < WINDOW or len(plain) < PLAIN_SAMPLES):
            kept = [t for t in timed if t[0] >= 1 and t[1] > 0]
            plain = [s for w, s in kept if w == 1]
        if not kept:
            return
        with self._lock:
            self._samples.extend(kept[-WINDOW:])
            if plain:
                self._plain.extend(plain[-PLAIN_SAMPLES:])
                self._t1 = min(self._plain)
            self._fitted = False  # (refitted when next read)

    def wide_widths(self) -> int:
        """How many distinct widths >= 2 the window holds; 0 until a
        one-token forward has been timed too (the unit)."""
        with self._lock:
            return len({w for w, _ in self._samples if w >= 2}) if self._plain else 0

    def __call__(self, w: int) -> float:
        """c(w), in one-token forwards (w >= 1)."""
        if w <= 1:
            return 1.0
        t1, t2, b = self.line()
        return max((t2 + b * (w - 2)) / t1, 1.0)

    def line(self) -> Tuple[float, float, float]:
        """(t(1), t2, b): c(w) = max((t2 + b (w - 2)) / t(1), 1) for w >= 2."""
        if not self._fitted:
            with self._lock:
                self._line = _fit_line(self._samples, self._line)
                self._fitted = True
        return (self._t1, *self._line)

    def samples(self) -> List[Tuple[int, float]]:
        """The (width, seconds) samples in the window, oldest first."""
        with self._lock:
            return list(self._samples)

    def __repr__(self) -> str:
        return f"LearnedCost(c(2) = {self(2):.3f}, c(11) = {self(11):.3f}, {len(self._samples)} samples)"


def _fit_line(samples: Sequence[Tuple[int, float]], line: Tuple[float, float]) -> Tuple[float, float]:
    """(t2, b) of the forwards with drafts (see LearnedCost); ``line``
    when the samples hold none."""
    fastest: Dict[int, float] = {}
    counts: Dict[int, int] = {}
    for w, s in samples:
        if w >= 2:
            f = fastest.get(w)
            if f is None:
                fastest[w], counts[w] = s, 1
            else:
                if s < f:
                    fastest[w] = s
                counts[w] += 1
    if not fastest:
        return line
    points = [(w - 2, fastest[w], counts[w]) for w in fastest]
    n = mx = my = 0.0
    for x, y, k in points:
        n += k
        mx += x * k
        my += y * k
    mx, my = mx / n, my / n
    sxx = sxy = 0.0
    for x, y, k in points:
        sxx += k * (x - mx) ** 2
        sxy += k * (x - mx) * (y - my)
    b = max(sxy / sxx, 0.0) if sxx > 0 else 0.0
    t2 = my - b * mx
    if t2 <= 0:  # (a line through noisy points can pass below zero at w = 2)
        t2, b = min(y for _, y, _ in points), 0.0
    return t2, b


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


def waiter(device: Any) -> Callable[[], None]:
    """:func:`synchronizer` of ``device``, or a function that does nothing
    where there is nothing to wait for (the CPU)."""
    return synchronizer(device) or _nothing


def rng_devices(model: Any) -> Optional[List[int]]:
    """The CUDA devices ``model``'s parameters are on, whose RNG states a
    probe's forwards keep as they found them (with the CPU's); None for a
    model in eval mode, whose forwards draw nothing: its probes leave the
    RNG states alone (restoring them would also undo the draws another
    thread made meanwhile, and a seeded run there would not repeat)."""
    if not in_training(model):
        return None
    parameters = getattr(model, "parameters", None)
    if not callable(parameters):
        return []
    return sorted({p.get_device() for p in parameters() if p.device.type == "cuda"})


def in_training(model: Any) -> bool:
    """Whether any of ``model``'s modules is in training mode (model.train(),
    or one submodule's: a LoRA dropout switched back on), where dropout may
    draw; an object without modules() answers with its own ``training``
    (True where it has none: it may draw)."""
    modules = getattr(model, "modules", None)
    if callable(modules):
        return any(getattr(m, "training", False) for m in modules())
    return bool(getattr(model, "training", True))


def rng_kept(devices: Optional[Sequence[int]]) -> Any:
    """A context that keeps torch's RNG states of the CPU and the CUDA
    ``devices`` as it found them (:func:`rng_devices`; None: nothing to keep)."""
    import torch

    return contextlib.nullcontext() if devices is None else torch.random.fork_rng(devices=list(devices))


def time_widths(forward: Callable[[int], Any], widths: Sequence[int],
                clock: Callable[[], float] = time.perf_counter,
                synchronize: Optional[Callable[[], None]] = None,
                devices: Optional[Sequence[int]] = ()) -> List[float]:
    """The time of ``forward(w)`` (a forward over w new tokens that leaves
    the model's state as it found it) at each width in turn, in seconds.
    ``synchronize`` (None on the CPU) waits for the device before each
    clock read, so that a time is the forward's work, not its launch. The
    forwards do not count as decoding steps (:func:`calibrating`) and leave
    torch's RNG states as they were: the CPU's and those of the CUDA
    ``devices`` (:func:`rng_devices`; None: a model in eval mode, whose
    forwards draw nothing)."""
    wait = synchronize if synchronize is not None else _nothing
    global _calibrating
    times = []
    with _LOCK:
        _calibrating += 1
    try:
        with rng_kept(devices):
            for w in widths:
                wait()
                t0 = clock()
                forward(w)
                wait()
                times.append(max(clock() - t0, 1e-9))
    finally:
        with _LOCK:
            _calibrating -= 1
    return times


def _nothing() -> None:
    pass


_calibrating = 0
# Guards _calibrating and _TABLES.
_LOCK = threading.Lock()


def calibrating() -> bool:
    """Whether probe forwards are running (they are not decoding steps:
    the benchmark's forward counter leaves them out)."""
    return _calibrating > 0


# Learned costs kept per model: key (context size class, ...) -> LearnedCost,
# least recently used first; at most MAX_TABLES_PER_MODEL a model.
_TABLES: "weakref.WeakKeyDictionary[Any, collections.OrderedDict[Tuple, LearnedCost]]" = \
    weakref.WeakKeyDictionary()
#: Learned costs kept for one model; the least recently used goes first.
MAX_TABLES_PER_MODEL = 16

#: The clock the decoder times its forwards with (a test may replace it).
clock = time.perf_counter


def size_class(context: int) -> int:
    """Contexts within a factor of 4 share a learned cost: 0 below 256
    tokens, then 1 for [256, 1024), 2 for [1024, 4096), ..."""
    c, edge = 0, 256
    while context >= edge:
        c, edge = c + 1, edge * 4
    return c


def learned(model: Any, key: Tuple, forward: Callable[[int], Any], widths: Sequence[int],
            clock: Callable[[], float] = time.perf_counter,
            synchronize: Optional[Callable[[], None]] = None) -> LearnedCost:
    """The model's :class:`LearnedCost` for ``key`` (batch size, context
    size class, dtype, device, kernel...): the one kept, or a new one whose
    first samples are ``forward(w)`` timed once at each of ``widths`` (the
    probes: 1 and the widest a step may use; timed by ``clock`` after
    ``synchronize``). Keeps the MAX_TABLES_PER_MODEL most recently used
    keys of each model (a model that cannot be weakly referenced keeps
    none: probed every time). Safe across threads: the probes run outside
    the lock, and when two threads probe one key at once the first cost
    stored is the one both get."""
    with _LOCK:
        kept = _tables_of(model)
        cost = kept.get(key) if kept is not None else None
        if cost is not None:
            kept.move_to_end(key)
            return cost
    cost = LearnedCost()
    for w, seconds in zip(widths, time_widths(forward, widths, clock, synchronize, rng_devices(model))):
        cost.observe(w, seconds)
    if kept is None:
        return cost
    with _LOCK:
        cost = kept.setdefault(key, cost)
        kept.move_to_end(key)
        while len(kept) > MAX_TABLES_PER_MODEL:
            kept.popitem(last=False)
    return cost


def _tables_of(model: Any) -> "Optional[collections.OrderedDict[Tuple, ForwardCost]]":
    """``model``'s kept tables (created empty), or None for a model that
    cannot be weakly referenced. The caller holds _LOCK."""
    try:
        return _TABLES.setdefault(model, collections.OrderedDict())
    except TypeError:
        return None


def forget(model: Any) -> None:
    """Drop the costs learned for ``model`` (the next generation probes again)."""
    with _LOCK:
        _TABLES.pop(model, None)
