"""pld.linear_kernel: oneDNN linear layers while pld's loop decodes.

What it must do: compute what nn.Linear computes (to float32 rounding),
route only plain float32 CPU nn.Linear layers, put every layer back after
the block (also after an exception), refuse bad modes by name, and serve
every forward of the native loop (and none with ``linear_kernel="torch"``).
Token identity of the loop with either kernel is in test_hf_exactness.py.
Across threads: oneDNN serves only the threads inside a block, the layers
keep their routed forward until the last block (any thread, any kernel
object) leaves, blocks nest, and "auto"'s decisions are bounded (LRU).
"""
from __future__ import annotations

import collections
import random
import threading

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

torch = pytest.importorskip("torch")
nn = torch.nn

from pld import linear_kernel  # noqa: E402

needs_onednn = pytest.mark.skipif(not linear_kernel.onednn_available(),
                                  reason="this torch build has no oneDNN linear")


class _ScaledLinear(nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


def _toy() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8, bias=False), _ScaledLinear(8, 8))


def _count_onednn_widths(monkeypatch) -> list:
    """The token width of every oneDNN product from now on (the op is
    wrapped; the test's monkeypatch restores it)."""
    widths = []
    real = linear_kernel._OP

    def counting(x, *args):
        widths.append(x.shape[-2])
        return real(x, *args)

    monkeypatch.setattr(linear_kernel, "_OP", counting)
    return widths


@needs_onednn
def test_routed_layers_compute_what_nn_linear_computes():
    model = _toy()
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        expected = model(x)
        wide = linear_kernel.LinearKernel(model, "onednn")
        assert wide.active
        with wide.routing():
            assert all("forward" in vars(layer) for layer in wide.layers)
            got = model(x)
        after = model(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(after, expected)  # torch's own kernel again, bit for bit


@needs_onednn
def test_only_plain_float32_cpu_linears_are_routed():
    model = _toy()
    wide = linear_kernel.LinearKernel(model, "onednn")
    assert wide.layers == [model[0], model[2]]  # not the subclass with its own forward
    assert not linear_kernel.LinearKernel(_toy().double()).active
    assert "float32" in linear_kernel.LinearKernel(_toy().double()).reason


@needs_onednn
def test_layers_are_restored_after_an_exception():
    model = _toy()
    wide = linear_kernel.LinearKernel(model, "onednn")
    with pytest.raises(RuntimeError, match="boom"):
        with wide.routing():
            raise RuntimeError("boom")
    assert not any("forward" in vars(m) for m in model.modules())


def test_bad_modes_are_refused_by_name():
    import pld

    with pytest.raises(ValueError, match="linear_kernel"):
        linear_kernel.LinearKernel(_toy(), "fast")
    with pytest.raises(ValueError, match="linear_kernel"):
        pld.enable(linear_kernel="fast")
    assert not pld.is_enabled()
    ids = mf.as_ids([1, 2, 3, 1, 2])
    for bad in ("fast", None, 1):
        with pytest.raises(ValueError, match="linear_kernel"):
            pld.generate(mf.tiny_model("llama"), ids, max_new_tokens=2, linear_kernel=bad)
    with pytest.raises(ValueError, match="linear_kernel='onednn' cannot be used"):
        linear_kernel.LinearKernel(_toy().double(), "onednn")
    plain = linear_kernel.LinearKernel(_toy(), "torch")
    assert not plain.active and "torch" in plain.reason


@needs_onednn
@pytest.mark.parametrize("arch", mf.ARCHS)
def test_the_loop_runs_every_forward_on_the_chosen_kernel(arch, monkeypatch):
    """Count the oneDNN calls: one per linear layer in every forward of the
    loop (the prefill and drafted and one-token steps alike) with "onednn",
    none with "torch"; afterwards the model has torch's layers again."""
    from transformers import DynamicCache

    from pld import loop

    model = mf.tiny_model(arch)
    layers = linear_kernel.LinearKernel(model, "onednn").layers
    n_layers = len(layers)
    assert n_layers > 0
    # GPT-2's blocks are Conv1D: only its head is an nn.Linear, fed the
    # logits_to_keep = 1 + draft positions; Llama's first routed layer sees all
    head_only = layers == [model.get_output_embeddings()]
    assert head_only == (arch == "gpt2")
    widths = _count_onednn_widths(monkeypatch)
    rng = random.Random(f"routing-{arch}")
    for _ in range(6):
        ids = mf.as_ids(mf.repeated_prompt(rng))
        for mode, routed in (("onednn", True), ("torch", False)):
            widths.clear()
            with torch.no_grad():
                result = loop.run(model, ids, cache=DynamicCache(), max_new_tokens=16,
                                  prompt_lookup_num_tokens=4, record_steps=True, linear_kernel=mode,
                                  cost_aware=False)  # (no calibration forwards)
            assert len(widths) == (result.stats.steps * n_layers if routed else 0), mode
            if routed:  # the prefill first, then one pending token plus the draft
                steps = result.stats.records
                first = (1 if head_only else ids.shape[1]) + steps[0].proposed
                expected = [first] + [1 + r.proposed for r in steps[1:]]
                assert widths[::n_layers] == expected
            assert not any("forward" in vars(m) for m in model.modules())


@needs_onednn
@pytest.mark.parametrize("times,routes", [((1.0, 0.5), True), ((1.0, 0.89), True),
                                          ((1.0, 0.95), False), ((1.0, 2.0), False)])
def test_auto_routes_only_where_onednn_is_measured_clearly_faster(times, routes, monkeypatch):
    """"auto" follows the measurement (oneDNN within MARGIN of torch's time
    routes), measures once per set of layer shapes, and says why not."""
    calls = []

    def fake_measure(layers, repeats=3):
        calls.append(len(layers))
        return times

    monkeypatch.setattr(linear_kernel, "measure", fake_measure)
    monkeypatch.setattr(linear_kernel, "_DECISIONS", collections.OrderedDict())
    model = _toy()
    for _ in range(3):
        kernel = linear_kernel.LinearKernel(model)
        assert kernel.active == routes
        assert routes or "measured" in kernel.reason
    assert calls == [2]  # once, over the two routable layers
    assert linear_kernel.LinearKernel(model, "onednn").active  # an explicit choice is kept


@needs_onednn
def test_measure_times_both_kernels_over_every_layer(monkeypatch):
    seen = _count_onednn_widths(monkeypatch)
    layers = linear_kernel.LinearKernel(_toy(), "onednn").layers
    t_torch, t_onednn = linear_kernel.measure(layers, repeats=2)
    assert t_torch > 0 and t_onednn > 0
    # warm-up + 2 rounds, every width, every layer
    assert sorted(seen) == sorted([w for _ in range(3) for w in linear_kernel.WIDTHS for _ in layers])


# -- threads ------------------------------------------------------------------

WAIT = 60  # seconds a thread waits for another before the test fails


def _onednn_threads(monkeypatch) -> list:
    """The thread of every oneDNN product from now on."""
    threads = []
    real = linear_kernel._OP

    def recording(*args):
        threads.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(linear_kernel, "_OP", recording)
    return threads


def _in_threads(*targets):
    mf.in_threads(*targets, wait=WAIT)


@needs_onednn
def test_routing_outlives_a_thread_that_leaves_first(monkeypatch):
    """Two runs on one model, each with its own kernel object: A enters, B
    enters, A leaves while B is inside: B's forwards stay on oneDNN; after
    both, every layer has torch's forward again."""
    model = _toy()
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        expected = model(x)
    calls = _onednn_threads(monkeypatch)
    both_in = threading.Barrier(2, timeout=WAIT)
    a_left = threading.Event()
    seen = {}

    def a():
        with linear_kernel.LinearKernel(model, "onednn").routing():
            both_in.wait()
        a_left.set()

    def b():
        kernel = linear_kernel.LinearKernel(model, "onednn")
        with kernel.routing():
            both_in.wait()
            assert a_left.wait(WAIT)
            # a kernel made while B routes finds the same layers
            seen["layers"] = linear_kernel.LinearKernel(model, "onednn").layers == kernel.layers
            with torch.no_grad():
                got = model(x)
            seen["b"] = (calls.count(threading.get_ident()), all("forward" in vars(m) for m in kernel.layers))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)

    _in_threads(a, b)
    assert seen == {"layers": True, "b": (2, True)}  # both routed layers, on B's thread
    assert not any("forward" in vars(m) for m in model.modules())
    assert linear_kernel._USERS.get(model[0]) is None


@needs_onednn
def test_a_thread_outside_keeps_torchs_product(monkeypatch):
    """While thread A routes the model, a plain forward in another thread
    computes with torch's own product, bit for bit."""
    model = _toy()
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        expected = model(x)
    calls = _onednn_threads(monkeypatch)
    a_in, outside_done = threading.Event(), threading.Event()
    seen = {}

    def a():
        with linear_kernel.LinearKernel(model, "onednn").routing():
            a_in.set()
            assert outside_done.wait(WAIT)
            with torch.no_grad():
                model(x)
            seen["a"] = calls.count(threading.get_ident())

    def outside():
        assert a_in.wait(WAIT)
        try:
            seen["patched"] = "forward" in vars(model[0])
            with torch.no_grad():
                seen["same"] = torch.equal(model(x), expected)
            seen["outside"] = calls.count(threading.get_ident())
        finally:
            outside_done.set()

    _in_threads(a, outside)
    assert seen == {"patched": True, "same": True, "outside": 0, "a": 2}
    assert not any("forward" in vars(m) for m in model.modules())


@needs_onednn
def test_nested_routing_in_one_thread(monkeypatch):
    model = _toy()
    x = torch.randn(1, 5, 16)
    calls = _onednn_threads(monkeypatch)
    kernel = linear_kernel.LinearKernel(model, "onednn")
    with torch.no_grad(), kernel.routing():
        with kernel.routing():
            model(x)
        assert len(calls) == 2
        model(x)  # the outer block still routes
        assert len(calls) == 4
    with torch.no_grad():
        model(x)
    assert len(calls) == 4
    assert not any("forward" in vars(m) for m in model.modules())


def test_auto_decisions_are_kept_least_recently_used_first(monkeypatch):
    """At most MAX_DECISIONS sets of layer shapes are remembered; a hit
    measures nothing and makes its set the most recent."""
    measured = []

    def fake_measure(layers, repeats=3):
        measured.append(layers[0].in_features)
        return (1.0, 0.5)

    monkeypatch.setattr(linear_kernel, "measure", fake_measure)
    monkeypatch.setattr(linear_kernel, "_DECISIONS", collections.OrderedDict())
    monkeypatch.setattr(linear_kernel, "MAX_DECISIONS", 2)
    layers = {n: [nn.Linear(n, 4)] for n in (1, 2, 3)}
    for n in (1, 2, 1, 3):  # 1 again: a hit, so 2 is the oldest when 3 comes
        assert linear_kernel.onednn_pays(layers[n])
    assert measured == [1, 2, 3]
    assert len(linear_kernel._DECISIONS) == 2
    linear_kernel.onednn_pays(layers[1])
    assert measured == [1, 2, 3]
    linear_kernel.onednn_pays(layers[2])  # evicted: measured again
    assert measured == [1, 2, 3, 2]
