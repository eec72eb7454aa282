"""pld's switch (enable, disable, enabled) and its probes under threads,
as a web app serving one transformers model from several threads uses
them: a call that started runs to its end, transformers is left whole,
each enabled() block keeps its options, and a probe never moves torch's
RNG under another thread. The races are made deterministic with events
held in a streamer or a forward hook."""
from __future__ import annotations

import sys
import threading

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

WAIT = 30
IDS = [5, 9, 13, 7, 22, 5, 9, 13, 7, 22, 5, 9]


class _Pause:
    """A streamer that, on the prompt, says so and waits to be let go."""

    def __init__(self):
        self.reached, self.go = threading.Event(), threading.Event()
        self.first = True

    def put(self, value):
        if self.first:
            self.first = False
            self.reached.set()
            assert self.go.wait(WAIT)

    def end(self):
        pass


def _greedy(model, **kw):
    import torch

    with torch.no_grad():
        return model.generate(torch.tensor([IDS]), do_sample=False, max_new_tokens=12, **kw).tolist()


def test_a_call_that_started_finishes_when_another_thread_disables_pld(monkeypatch):
    """generate() picks its decoding method, then streams the prompt, then
    runs it: disable() in between used to leave the call without
    transformers' original method (a KeyError)."""
    import pld
    from pld import loop

    model = mf.tiny_model("llama")
    plain = _greedy(model)
    runs = []
    real = loop.run
    monkeypatch.setattr(loop, "run", lambda *a, **k: runs.append(1) or real(*a, **k))
    pause, out = _Pause(), []
    pld.enable()
    try:
        def call():
            out.append(_greedy(model, prompt_lookup_num_tokens=4, streamer=pause))

        def switch_off():
            assert pause.reached.wait(WAIT)
            pld.disable()
            pause.go.set()

        mf.in_threads(call, switch_off)
    finally:
        pld.disable()
    assert out == [plain] and runs == [1]  # (served by pld's loop, as it started)
    assert not pld.is_enabled()


def test_racing_switches_leave_transformers_whole():
    """enable(), disable() and enabled() from three threads at once, many
    times: afterwards transformers holds its own three attributes."""
    from transformers.generation import utils

    import pld

    before = (utils.PromptLookupCandidateGenerator, utils.GenerationMixin._assisted_decoding,
              utils.GenerationMixin._validate_generation_mode)

    def on_off():
        for _ in range(1500):
            pld.enable()
            pld.disable()

    def blocks():
        for _ in range(1500):
            with pld.enabled(cost_aware=False):
                assert pld.is_enabled()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        mf.in_threads(on_off, on_off, blocks)
    finally:
        sys.setswitchinterval(interval)
        pld.disable()
    assert (utils.PromptLookupCandidateGenerator, utils.GenerationMixin._assisted_decoding,
            utils.GenerationMixin._validate_generation_mode) == before
    assert not pld.is_enabled()


def test_overlapping_blocks_in_two_threads_each_keep_pld_on_and_their_options(monkeypatch):
    """Thread A's block starts, thread B's block starts and ends, then A
    generates: pld is still on for A, with A's options (not B's, nor
    enable()'s defaults), and off once both have ended."""
    import pld
    from pld import from_generate, loop

    model = mf.tiny_model("llama")
    plain = _greedy(model)
    configs = []
    real = loop.run
    monkeypatch.setattr(loop, "run", lambda m, i, config, **k: configs.append(config) or real(m, i, config, **k))
    a_in, b_done, out = threading.Event(), threading.Event(), []

    def a():
        with pld.enabled(cost_aware=False, min_ngram_size=2):
            a_in.set()
            assert b_done.wait(WAIT)
            assert pld.is_enabled()
            assert from_generate._current_options() == {"cost_aware": False, "min_ngram_size": 2}
            out.append(_greedy(model, prompt_lookup_num_tokens=4))

    def b():
        assert a_in.wait(WAIT)
        with pld.enabled(min_ngram_size=1):
            assert from_generate._current_options() == {"min_ngram_size": 1}
        b_done.set()

    mf.in_threads(a, b)
    assert out == [plain]
    assert len(configs) == 1 and configs[0].cost_aware is False and configs[0].min_ngram_size == 2
    assert not pld.is_enabled()


def test_a_probe_leaves_another_threads_seeded_sampling_alone():
    """Thread B's first pld call on a new model probes it (a few
    forwards) while thread A samples with a seed: A's tokens are those of
    the same seeded run alone. (The probes used to fork torch's RNG and
    set it back on leaving, undoing A's draws meanwhile.)"""
    import torch

    import pld

    sampler, probed = mf.tiny_model("llama", seed=0), mf.tiny_model("llama", seed=1)
    ids = torch.tensor([IDS])

    def sample(streamer=None):
        with torch.no_grad():
            return sampler.generate(ids, do_sample=True, top_k=0, max_new_tokens=20, streamer=streamer).tolist()

    torch.manual_seed(0)
    alone = sample()
    b_in_probe, a_mid, b_done = threading.Event(), threading.Event(), threading.Event()

    class Midway:
        n = 0

        def put(self, value):
            self.n += 1
            if self.n == 6:  # (A has drawn 5 tokens)
                a_mid.set()
                assert b_done.wait(WAIT)

        def end(self):
            pass

    out = []

    def a():
        assert b_in_probe.wait(WAIT)
        torch.manual_seed(0)
        out.append(sample(Midway()))

    first = [True]

    def hold(module, args, kwargs):
        if first[0]:  # (the probe's first forward)
            first[0] = False
            b_in_probe.set()
            assert a_mid.wait(WAIT)

    def b():
        handle = probed.model.register_forward_pre_hook(hold, with_kwargs=True)
        try:
            pld.generate(probed, ids, max_new_tokens=8)
        finally:
            handle.remove()
            b_done.set()

    from pld import forward_cost, hf_adapter

    hf_adapter._TRAITS.pop(probed, None)
    forward_cost.forget(probed)
    mf.in_threads(a, b)
    assert out == [alone]


def test_a_worker_thread_a_block_starts_gets_the_blocks_options(monkeypatch):
    """The streaming pattern: generate() runs in a worker thread the block
    starts while the block's thread reads the streamer. The worker runs
    in no block of its own, so it gets the (newest) block's options, as
    before the options moved into the block's thread."""
    import pld
    from pld import loop

    model = mf.tiny_model("llama")
    plain = _greedy(model)
    configs, out = [], []
    real = loop.run
    monkeypatch.setattr(loop, "run", lambda m, i, config, **k: configs.append(config) or real(m, i, config, **k))
    with pld.enabled(cost_aware=False, min_ngram_size=2):
        worker = threading.Thread(target=lambda: out.append(_greedy(model, prompt_lookup_num_tokens=4)))
        worker.start()
        worker.join(WAIT)
    assert out == [plain]
    assert len(configs) == 1 and configs[0].cost_aware is False and configs[0].min_ngram_size == 2
