"""pld.forward_cost's calibration cache: keyed, bounded, shared safely.

``cached_or_measure`` measures a key once per model (a hit calls no
forward), keeps at most MAX_TABLES_PER_MODEL tables a model with the least
recently used dropped first, keeps models apart, measures every time for a
model it cannot reference weakly, and gives two threads that measure one
key at once the same table. The forwards and the clock are fakes: a
forward over w tokens takes w ticks.
"""
from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.torch  # measure() forks torch's RNG

pytest.importorskip("torch")

from pld import forward_cost  # noqa: E402

WIDTHS = (1, 2, 8)
WAIT = 60  # seconds a thread waits for another before the test fails


class _Model:
    """A stand-in model: weakly referenceable, hashable by identity."""


class _Ticks:
    """A fake forward and clock: a forward over w tokens advances the
    (per-thread) clock by w ticks; ``calls`` lists every width run."""

    def __init__(self) -> None:
        self.calls = []
        self._now = threading.local()

    def clock(self) -> float:
        return getattr(self._now, "t", 0.0)

    def forward(self, w: int) -> None:
        self.calls.append(w)
        self._now.t = self.clock() + w


def _get(model, key, ticks):
    return forward_cost.cached_or_measure(model, key, ticks.forward, WIDTHS, clock=ticks.clock)


def test_a_hit_measures_nothing():
    model, ticks = _Model(), _Ticks()
    table = _get(model, ("step", 0), ticks)
    assert table.costs == (1.0, 2.0, 8.0)  # the fake clock's widths
    n = len(ticks.calls)
    assert n == 1 + forward_cost.REPEATS * len(WIDTHS)  # warm-up + timed rounds
    assert _get(model, ("step", 0), ticks) is table
    assert len(ticks.calls) == n
    _get(model, ("step", 1), ticks)  # another key is measured
    assert len(ticks.calls) == 2 * n


def test_least_recently_used_tables_go_first():
    model, ticks = _Model(), _Ticks()
    cap = forward_cost.MAX_TABLES_PER_MODEL
    tables = {k: _get(model, k, ticks) for k in range(cap)}
    assert _get(model, 0, ticks) is tables[0]  # a hit: 0 is now the most recent
    _get(model, cap, ticks)                    # one too many: 1, the oldest, goes
    kept = forward_cost._TABLES[model]
    assert len(kept) == cap
    assert 1 not in kept and 0 in kept and cap in kept
    n = len(ticks.calls)
    assert _get(model, 0, ticks) is tables[0]
    assert len(ticks.calls) == n
    assert _get(model, 1, ticks) is not tables[1]  # measured again
    assert len(ticks.calls) > n
    assert len(forward_cost._TABLES[model]) == cap


def test_models_are_kept_apart_and_forgotten():
    a, b, ticks = _Model(), _Model(), _Ticks()
    table = _get(a, "k", ticks)
    n = len(ticks.calls)
    assert _get(b, "k", ticks) is not table
    assert len(ticks.calls) == 2 * n
    forward_cost.forget(a)
    assert a not in forward_cost._TABLES and b in forward_cost._TABLES
    _get(a, "k", ticks)
    assert len(ticks.calls) == 3 * n


def test_a_model_without_weak_references_is_measured_every_time():
    model, ticks = object(), _Ticks()
    _get(model, "k", ticks)
    n = len(ticks.calls)
    _get(model, "k", ticks)
    assert len(ticks.calls) == 2 * n


def test_threads_measuring_one_key_at_once_get_one_table():
    """Both threads miss (each waits for the other in its first forward),
    both measure, and the first table stored is the one both get."""
    model, ticks = _Model(), _Ticks()
    both_measuring = threading.Barrier(2, timeout=WAIT)
    got, errors = [], []

    def forward(w):
        if not hasattr(ticks._now, "started"):
            ticks._now.started = True
            both_measuring.wait()
        ticks.forward(w)

    def run():
        try:
            got.append(forward_cost.cached_or_measure(model, "k", forward, WIDTHS, clock=ticks.clock))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not errors and len(got) == 2
    assert got[0] is got[1]
    assert list(forward_cost._TABLES[model]) == ["k"]
    assert not forward_cost.calibrating()


class _AsyncDevice:
    """A fake GPU: a forward over w tokens queues w ticks of work and
    returns after a launch of 0.01 ticks; ``synchronize`` runs the queue."""

    def __init__(self) -> None:
        self.now, self.queued, self.waits = 0.0, 0.0, 0

    def clock(self) -> float:
        return self.now

    def forward(self, w: int) -> None:
        self.now += 0.01
        self.queued += w

    def synchronize(self) -> None:
        self.waits += 1
        self.now += self.queued
        self.queued = 0.0


def test_an_asynchronous_device_is_timed_after_its_work_is_done():
    """Without waiting for the device, a clock read after a forward times
    the launch: every width looks as cheap as one token. With the device's
    synchronize, c(w) is the work's."""
    unsynced = _AsyncDevice()
    blind = forward_cost.measure(unsynced.forward, WIDTHS, clock=unsynced.clock)
    assert blind.costs == (1.0, 1.0, 1.0)  # the defect a GPU would show
    device = _AsyncDevice()
    table = forward_cost.measure(device.forward, WIDTHS, clock=device.clock, synchronize=device.synchronize)
    assert table.costs == pytest.approx((1.0, 2.01 / 1.01, 8.01 / 1.01))
    assert device.waits == 2 * forward_cost.REPEATS * len(WIDTHS)  # before and after each timed forward
    cached = forward_cost.cached_or_measure(_Model(), "k", device.forward, WIDTHS, clock=device.clock,
                                            synchronize=device.synchronize)
    assert cached.costs == pytest.approx(table.costs)


def test_the_synchronizer_follows_the_device():
    assert forward_cost.synchronizer("cpu") is None
    assert callable(forward_cost.synchronizer("cuda"))  # made, not called: no GPU needed
    assert callable(forward_cost.synchronizer("cuda:1"))


def test_the_decoder_calibrates_with_its_devices_synchronizer(monkeypatch):
    """The loop's calibration waits for the model's device before every
    clock read (a counting stand-in for torch.cuda.synchronize)."""
    import torch

    from models_fixtures import tiny_model

    import pld

    waits = []
    asked = []

    def synchronizer(device):
        asked.append(torch.device(device).type)
        return lambda: waits.append(1)

    monkeypatch.setattr(forward_cost, "synchronizer", synchronizer)
    model = tiny_model()
    forward_cost.forget(model)
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]])
    pld.generate(model, ids, max_new_tokens=6, eos_token_id=None)
    forward_cost.forget(model)
    assert asked == ["cpu"]
    assert len(waits) >= 2 * forward_cost.REPEATS * 2  # two timed widths at least, each waited on twice
