"""pld.forward_cost: the cost a forward is learned from the forwards that
run, kept per model and key, and timed after the device is done.

``LearnedCost`` fits a line through each width's fastest time among the
last WINDOW forwards with drafts, and keeps the fastest recent one-token
forward: it recovers clean samples' costs (a fixed cost of any draft
included), ignores spikes shorter than a width's samples, forgets any
spike within WINDOW samples, takes one width as flat. ``learned`` probes a key once per model (two timed forwards; a hit
runs none), keeps at most MAX_TABLES_PER_MODEL keys a model with the least
recently used dropped first, keeps models apart, probes every time for a
model it cannot reference weakly, and gives two threads that probe one key
at once the same cost. A fake asynchronous device shows every clock read
waits for the work. In the loop, a spike in the first steps (a fake clock)
stops drafting for a while, and the drafts come back within a bounded
number of steps.
"""
from __future__ import annotations

import threading

import numpy as np

import pytest

pytestmark = pytest.mark.torch  # the probes fork torch's RNG

pytest.importorskip("torch")

from pld import forward_cost  # noqa: E402
from pld.forward_cost import WINDOW, ForwardCost, LearnedCost  # noqa: E402

WIDTHS = (1, 8)
WAIT = 60  # seconds a thread waits for another before the test fails


class _Model:
    """A stand-in model: weakly referenceable, hashable by identity."""


class _Ticks:
    """A fake forward and clock: a forward over w tokens advances the
    (per-thread) clock by 1 + 0.25 (w - 1) ticks; ``calls`` lists every width run."""

    def __init__(self) -> None:
        self.calls = []
        self._now = threading.local()

    def clock(self) -> float:
        return getattr(self._now, "t", 0.0)

    def forward(self, w: int) -> None:
        self.calls.append(w)
        self._now.t = self.clock() + 1 + 0.25 * (w - 1)


def _get(model, key, ticks):
    return forward_cost.learned(model, key, ticks.forward, WIDTHS, clock=ticks.clock)


# -- LearnedCost -----------------------------------------------------------------

def test_clean_samples_give_their_costs():
    cost = LearnedCost()
    for w in (1, 3, 11, 1, 3, 11):
        cost.observe(w, 2.0 + 0.1 * (w - 1))
    assert cost(1) == 1.0
    assert cost(3) == pytest.approx(1.1) and cost(11) == pytest.approx(1.5) and cost(21) == pytest.approx(2.0)


def test_a_draft_pays_a_fixed_cost_then_a_little_a_token():
    """As on a CPU: any draft costs 0.3 of a forward more, then 0.03 a
    token. One line from w = 1 would take the jump for a slope."""
    cost = LearnedCost()
    for w in (1, 2, 5, 11) * 3:
        cost.observe(w, 1.0 if w == 1 else 1.3 + 0.03 * (w - 2))
    assert cost(2) == pytest.approx(1.3) and cost(5) == pytest.approx(1.39) and cost(11) == pytest.approx(1.57)


def test_one_width_with_drafts_is_taken_as_flat_until_another_is_seen():
    cost = LearnedCost()
    for _ in range(3):
        cost.observe(11, 7.0)
    cost.observe(1, 2.0)  # a one-token forward: the level of every draft
    assert cost(2) == cost(11) == pytest.approx(3.5)
    cost.observe(6, 4.5)  # a second width with drafts: the slope
    assert cost(2) == pytest.approx(2.5 / 2.0) and cost(11) == pytest.approx(3.5)


def test_a_wider_forward_never_costs_less_and_bad_samples_are_ignored():
    cost = LearnedCost()
    cost.observe(2, 3.0)
    cost.observe(9, 1.0)  # noise: the fitted line would fall
    cost.observe(1, 3.0)  # and a one-token forward as slow as the drafts
    assert cost(2) == cost(9) == 1.0
    cost.observe(0, 1.0)
    cost.observe(4, 0.0)
    cost.observe(4, float("nan"))
    assert len(cost.samples()) == 3


@pytest.mark.parametrize("bad", [0.2, 0.0])
def test_observe_many_is_observe_in_turn(bad):
    """With bad = 0 (every (width, seconds) a sample) it reads only the
    last WINDOW where they hold PLAIN_SAMPLES one-token ones."""
    rng = np.random.default_rng(0)
    for size in (0, 1, 5, 31, 32, 33, 40, 200):
        for plain in (0.0, 0.05, 0.2, 0.5, 1.0):
            samples = [(1 if rng.random() < plain else int(rng.integers(1 if not bad else -1, 12)),
                        float(rng.choice([rng.random() + 1e-9, 0.0, float("nan")], p=[1 - bad, bad / 2, bad / 2])))
                       for _ in range(size)]
            one, many = LearnedCost(), LearnedCost()
            for w, s in [(1, 0.01), (3, 0.02)] + samples:
                one.observe(w, s)
            many.observe_many([(1, 0.01), (3, 0.02)])
            many.observe_many(samples)
            assert many.samples() == one.samples() and many._plain == one._plain
            assert [many(w) for w in range(1, 12)] == [one(w) for w in range(1, 12)]


def test_spikes_shorter_than_a_widths_samples_do_not_count():
    cost = LearnedCost()
    for i in range(12):
        w = (1, 2, 11)[i % 3]
        cost.observe(w, (1.0 if w == 1 else 1.3 + 0.03 * (w - 2)) * (4.0 if i in (1, 5, 6) else 1.0))
    assert cost(2) == pytest.approx(1.3) and cost(11) == pytest.approx(1.57)


def test_a_load_spike_is_forgotten_within_the_window():
    """Ten forwards at five times their cost, then clean ones: the spike
    counts as long as it is in the window and not a sample longer."""
    true = lambda w: 1.0 + 0.05 * (w - 1)  # noqa: E731
    cost = LearnedCost()
    widths = [1, 6, 11, 6]
    for i in range(10):  # a spike on the wide forwards only
        w = widths[i % 4]
        cost.observe(w, true(w) * (5.0 if w > 1 else 1.0))
    assert cost(11) > 5
    for i in range(WINDOW):
        w = widths[i % 4]
        cost.observe(w, true(w))
    assert cost(6) == pytest.approx(1.25) and cost(11) == pytest.approx(1.5)


# -- learned: probes, kept per model and key ---------------------------------------

def test_a_new_key_probes_twice_and_a_hit_probes_nothing():
    model, ticks = _Model(), _Ticks()
    cost = _get(model, ("step", 0), ticks)
    assert ticks.calls == [1, 8]  # one timed forward a width, no warm-up
    assert cost(2) == cost(8) == pytest.approx(2.75) and len(cost.samples()) == 2  # one width: flat
    assert _get(model, ("step", 0), ticks) is cost
    assert ticks.calls == [1, 8]
    _get(model, ("step", 1), ticks)  # another key is probed
    assert ticks.calls == [1, 8, 1, 8]


def test_least_recently_used_keys_go_first():
    model, ticks = _Model(), _Ticks()
    cap = forward_cost.MAX_TABLES_PER_MODEL
    costs = {k: _get(model, k, ticks) for k in range(cap)}
    assert _get(model, 0, ticks) is costs[0]  # a hit: 0 is now the most recent
    _get(model, cap, ticks)                    # one too many: 1, the oldest, goes
    kept = forward_cost._TABLES[model]
    assert len(kept) == cap
    assert 1 not in kept and 0 in kept and cap in kept
    n = len(ticks.calls)
    assert _get(model, 0, ticks) is costs[0]
    assert len(ticks.calls) == n
    assert _get(model, 1, ticks) is not costs[1]  # probed again
    assert len(ticks.calls) > n


def test_models_are_kept_apart_and_forgotten():
    a, b, ticks = _Model(), _Model(), _Ticks()
    cost = _get(a, "k", ticks)
    assert _get(b, "k", ticks) is not cost
    assert len(ticks.calls) == 4
    forward_cost.forget(a)
    assert a not in forward_cost._TABLES and b in forward_cost._TABLES
    _get(a, "k", ticks)
    assert len(ticks.calls) == 6


def test_a_model_without_weak_references_is_probed_every_time():
    model, ticks = object(), _Ticks()
    kept = len(forward_cost._TABLES)
    _get(model, "k", ticks)
    _get(model, "k", ticks)
    assert len(ticks.calls) == 4
    assert len(forward_cost._TABLES) == kept


def test_threads_probing_one_key_at_once_get_one_cost():
    """Both threads miss (each waits for the other in its first forward),
    both probe, and the first cost stored is the one both get."""
    model, ticks = _Model(), _Ticks()
    both_probing = threading.Barrier(2, timeout=WAIT)
    got, errors = [], []

    def forward(w):
        if not hasattr(ticks._now, "started"):
            ticks._now.started = True
            both_probing.wait()
        ticks.forward(w)

    def run():
        try:
            got.append(forward_cost.learned(model, "k", forward, WIDTHS, clock=ticks.clock))
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


# -- timing on an asynchronous device ------------------------------------------------

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
    blind = forward_cost.time_widths(unsynced.forward, (1, 2, 8), clock=unsynced.clock)
    assert ForwardCost((1, 2, 8), blind).costs == pytest.approx((1.0, 1.0, 1.0))  # the defect a GPU would show
    device = _AsyncDevice()
    times = forward_cost.time_widths(device.forward, (1, 2, 8), clock=device.clock, synchronize=device.synchronize)
    assert ForwardCost((1, 2, 8), times).costs == pytest.approx((1.0, 2.01 / 1.01, 8.01 / 1.01))
    assert device.waits == 2 * 3  # before and after each timed forward
    probed = forward_cost.learned(_Model(), "k", device.forward, WIDTHS, clock=device.clock,
                                  synchronize=device.synchronize)
    assert probed(8) == pytest.approx(8.01 / 1.01)


def test_the_synchronizer_follows_the_device():
    assert forward_cost.synchronizer("cpu") is None
    assert callable(forward_cost.synchronizer("cuda"))  # made, not called: no GPU needed
    assert callable(forward_cost.synchronizer("cuda:1"))


def test_the_decoder_waits_for_its_device_before_every_clock_read(monkeypatch):
    """The loop's probes and every timed step wait for the model's device
    (a counting stand-in for torch.cuda.synchronize) before the clock."""
    import torch

    from models_fixtures import tiny_model

    import pld

    events = []
    asked = set()

    def synchronizer(device):
        asked.add(torch.device(device).type)
        return lambda: events.append("wait")

    def clock():
        events.append("clock")
        return float(len(events))

    monkeypatch.setattr(forward_cost, "synchronizer", synchronizer)
    monkeypatch.setattr(forward_cost, "clock", clock)
    model = tiny_model()
    forward_cost.forget(model)
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]])
    pld.generate(model, ids, max_new_tokens=8, eos_token_id=None)
    cost = list(forward_cost._TABLES[model].values())[0]
    forward_cost.forget(model)
    assert asked == {"cpu"}
    reads = [i for i, e in enumerate(events) if e == "clock"]
    assert len(reads) >= 2 * 3 and all(events[i - 1] == "wait" for i in reads)
    assert len(cost.samples()) == len(reads) // 2  # the probes and every step after the prefill


# -- in the loop: a spike is forgotten ---------------------------------------------

def test_a_spike_in_the_first_steps_stops_drafts_for_a_bounded_number_of_steps(monkeypatch):
    """A fake clock makes every forward wider than one token cost ten times
    its due during the first steps: the loop stops drafting, explores, and
    drafts again once the spike has left the learned cost's window."""
    import random

    import models_fixtures as mf
    import pld
    from pld.hf_adapter import model_traits

    model = mf.tiny_model("gpt2")  # (a tied GPT-2 repeats itself: drafts are accepted)
    model_traits(model)  # (its probe's forwards before the clock starts)
    forward_cost.forget(model)
    now = [0.0]
    forwards = []

    def on_forward(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        w = ids.shape[1]
        forwards.append(w)
        spike = 10.0 if len(forwards) <= 8 and w > 1 else 1.0  # the prefill, the probes, 5 steps
        now[0] += (1.0 + 0.02 * (w - 1)) * spike

    monkeypatch.setattr(forward_cost, "clock", lambda: now[0])
    handle = model.register_forward_pre_hook(on_forward, with_kwargs=True)
    try:
        ids = mf.as_ids(mf.repeated_prompt(random.Random("spike"), min_len=40))
        steps = []
        out = pld.generate(model, ids, max_new_tokens=120, eos_token_id=None, on_step=steps.append)
    finally:
        handle.remove()
        forward_cost.forget(model)
    assert out.new_tokens == mf.greedy(model, ids, 120)
    proposed = [r.proposed for r in steps[1:]]
    assert proposed[0] == 0  # the spiked probe: drafts judged not to pay
    bound = WINDOW + 16 + 4  # the window, an exploration period, slack
    assert any(p > 1 for p in proposed[:bound]), proposed
    assert sum(p > 1 for p in proposed[bound:]) >= len(proposed[bound:]) // 2, proposed


def test_the_probes_keep_the_rng_states_of_the_model_s_cuda_devices(monkeypatch):
    """A probe's forwards leave torch's RNG states as they found them: the
    CPU's, and those of each CUDA device the model's parameters are on (a
    model whose forward draws, as one in train mode, would else move
    them). Parameters that say they are on CUDA devices 1 and 3 stand in
    for a GPU model's."""
    import types

    import torch

    def parameter(device):
        where = torch.device(device)
        return types.SimpleNamespace(device=where, get_device=lambda: -1 if where.index is None else where.index)

    model = types.SimpleNamespace(parameters=lambda: iter([parameter("cuda:3"), parameter("cpu"),
                                                           parameter("cuda:1"), parameter("cuda:3")]))
    assert forward_cost.rng_devices(model) == [1, 3]
    assert forward_cost.rng_devices(object()) == []
    forked = []
    real = torch.random.fork_rng
    monkeypatch.setattr(torch.random, "fork_rng", lambda devices=None, **kw: forked.append(devices) or real(devices=[]))
    forward_cost.time_widths(lambda w: None, [1, 2], devices=[1, 3])
    assert forked == [[1, 3]]
    forked.clear()
    forward_cost.learned(model, ("rng", 1), lambda w: None, [1, 2])  # (a new cost: its probes)
    assert forked == [[1, 3]]
