"""What the benchmarks must do on a GPU, checked on the CPU.

A GPU forward returns once its kernels are queued: every clock read must
wait for the device first, or it times launches. And a batch must reach
the model on the model's device. The first GPU run (an H100) found both
wrong in the batch benchmark: its prompts stayed on the CPU (a crash), and
its clock was read without waiting. Stand-ins here: a recorder in place of
torch.cuda.synchronize, and the meta device in place of a GPU's.
"""
from __future__ import annotations

import argparse
import types

import pytest

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch")

from pld import forward_cost  # noqa: E402
from pld.bench import batch, generation, host_time, replay, shapes  # noqa: E402


class _Events:
    def __init__(self):
        self.seen = []

    def sync(self):
        self.seen.append("sync")

    def meter(self, calls, seconds):
        """A stand-in ForwardMeter that records its syncs and resets here."""
        return types.SimpleNamespace(calls=calls, seconds=seconds, sync=self.sync,
                                     reset=lambda: self.seen.append("reset"))


def test_the_forward_meter_waits_for_its_device_around_every_forward(monkeypatch):
    events = _Events()
    asked = []

    def synchronizer(device):
        asked.append(str(device))
        return events.sync

    monkeypatch.setattr(forward_cost, "synchronizer", synchronizer)
    layer = torch.nn.Linear(2, 2)
    layer.register_forward_hook(lambda *a: events.seen.append("forward"))
    meter = generation.ForwardMeter(layer, "cuda:1")
    layer(torch.ones(1, 2))
    meter.remove()
    assert asked == ["cuda:1"]
    assert events.seen == ["sync", "forward", "sync"]  # (the meter's hook runs after the one registered first)
    assert meter.calls == 1


def test_a_generation_is_timed_after_the_device_is_done(monkeypatch):
    events = _Events()

    def generate(ids):
        events.seen.append("generate")
        return torch.cat([ids, torch.tensor([[7, 8]])], dim=1)

    tok = types.SimpleNamespace(decode=lambda ids, skip_special_tokens: "x")
    row = generation.measure(generate, torch.tensor([[1, 2, 3]]), tok, events.meter(3, 0.5))
    assert events.seen == ["sync", "reset", "generate", "sync"]
    assert row["new_tokens"] == 2 and row["forward_calls"] == 3


def test_host_time_is_wall_time_minus_forward_time_per_forward(monkeypatch):
    ticks = iter([10.0, 12.0])
    monkeypatch.setattr(generation.time, "perf_counter", lambda: next(ticks))
    events = _Events()
    got = host_time.timed(lambda ids: torch.zeros((1, 9)), torch.zeros((1, 4)), events.meter(4, 1.2))
    assert events.seen == ["sync", "reset", "sync"]
    assert got["new_tokens"] == 5 and got["forwards"] == 4
    assert got["host_ms_per_forward"] == pytest.approx((2.0 - 1.2) / 4 * 1e3)
    assert got["forward_ms"] == pytest.approx(1.2 / 4 * 1e3)


def test_left_padded_batches_are_made_on_the_given_device():
    tok = types.SimpleNamespace(pad_token_id=0, eos_token_id=1)
    rows = [torch.tensor([[5, 6, 7]]), torch.tensor([[8]])]
    ids, mask, pad = batch.left_padded(tok, rows)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]] and pad == 0
    ids, mask, _ = batch.left_padded(tok, rows, "meta")
    assert ids.device.type == "meta" and mask.device.type == "meta"


def test_the_batch_benchmark_feeds_the_models_device_and_waits_for_it(monkeypatch, tmp_path):
    """Every method gets the batch on the model's device (meta here), and
    each timing starts and ends with the device synchronised."""
    events = _Events()
    devices = []

    def method(name):
        def run(ids, mask):
            devices.append((name, ids.device.type, mask.device.type))
            events.seen.append("generate")
            return torch.cat([torch.zeros(ids.shape, dtype=torch.long), torch.tensor([[4, 2]] * ids.shape[0])], 1)
        return run

    monkeypatch.setattr(batch, "_methods", lambda model, args, pad: {m: method(m) for m in ("greedy", "pld")})
    monkeypatch.setattr(generation, "chat_input_ids", lambda tok, turns, answers: torch.tensor([[5, 6, 7]]))
    model = types.SimpleNamespace(parameters=lambda: iter([torch.empty(1, device="meta")]),
                                  generation_config=types.SimpleNamespace(eos_token_id=2))
    meter = events.meter(2, 0.0)
    prompts = [types.SimpleNamespace(task="rag", turns=("q",)) for _ in range(4)]
    args = argparse.Namespace(batch_size=2, out=str(tmp_path))
    tok = types.SimpleNamespace(pad_token_id=0, eos_token_id=2)
    assert batch.run(args, prompts, model, tok, meter, "caption") == 0
    assert len(devices) == 2 * (1 + 2)  # two methods: a warm-up batch and two batches
    assert {d[1:] for d in devices} == {("meta", "meta")}
    timed = events.seen[events.seen.index("reset") - 1:]  # after the warm-up
    assert timed == ["sync", "reset", "generate", "sync"] * 4


def test_a_random_llama_repeats_and_leaves_torchs_rng_alone():
    state = torch.get_rng_state()
    a = shapes.random_llama("tiny", torch.float32, "cpu", seed=3)
    assert torch.equal(state, torch.get_rng_state())
    b = shapes.random_llama("tiny", torch.float32, "cpu", seed=3)
    c = shapes.random_llama("tiny", torch.float32, "cpu", seed=4)
    pairs = list(zip(a.parameters(), b.parameters()))
    assert all(torch.equal(x, y) for x, y in pairs)
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters()))
    assert a.config.hidden_size == shapes.SHAPES["tiny"]["hidden_size"]
    with pytest.raises(ValueError, match="shape"):
        shapes.random_llama("13b", torch.float32, "cpu")


def test_the_replay_runs_each_step_at_its_width_and_keeps_what_was_accepted():
    """Step i forwards 1 + verified tokens onto a cache that holds the
    prompt but its last token plus what the steps before kept."""
    from pld.hf_adapter import model_traits

    model = shapes.random_llama("tiny", torch.float32, "cpu")
    model_traits(model)  # (its probe's forwards first)
    seen = []
    model.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["input_ids"].shape[1], _cached(kwargs))),
        with_kwargs=True)
    waits = []
    steps = [(10, 3, 4), (0, 0, 1), (5, 5, 6), (7, 0, 1)]
    seconds = replay.replay(model, 40, steps, lambda: waits.append(1))
    assert seconds > 0 and len(waits) == 2
    assert seen[0] == (39, 0)  # the prefill: the prompt but its last token
    widths = [w for w, _ in seen[1:]]
    cached = [c for _, c in seen[1:]]
    assert widths == [11, 1, 6, 8]
    assert cached == [39, 39 + 4, 39 + 5, 39 + 11]


def _cached(kwargs):
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    return cache.get_seq_length() if cache is not None else 0


def test_the_forward_cost_curve_waits_for_the_device_around_every_forward():
    model = shapes.random_llama("tiny", torch.float32, "cpu")
    waits = []
    got = _curve(model, waits)
    assert sorted(got) == [1, 2, 5]
    assert all(s > 0 for s in got.values())
    assert len(waits) == 2 * 3 * 3  # (2 timed rounds + a warm-up) x 3 widths, before and after


def _curve(model, waits):
    from pld.bench import forward_curve

    return forward_curve.curve(model, 30, [1, 2, 5], 2, lambda: waits.append(1))
