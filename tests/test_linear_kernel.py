"""pld.linear_kernel: oneDNN linear layers while pld's loop decodes.

What it must do: compute what nn.Linear computes (to float32 rounding),
route only plain float32 CPU nn.Linear layers, put every layer back after
the block (also after an exception), refuse bad modes by name, and serve
every forward of the native loop (and none with ``linear_kernel="torch"``).
Token identity of the loop with either kernel is in test_hf_exactness.py.
"""
from __future__ import annotations

import random

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
                                  num_pred_tokens=4, record_steps=True, linear_kernel=mode,
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
    monkeypatch.setattr(linear_kernel, "_DECISIONS", {})
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
