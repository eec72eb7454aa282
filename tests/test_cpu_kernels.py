"""pld.cpu_kernels: the CPU machinery of pld's loop, entered only for a
model on the CPU, nothing at import.

Entry: for a model on ``meta`` or one that says it is on CUDA, entering
probes nothing, routes no layer and leaves transformers alone; on the CPU
the adapter enters both; importing pld runs no tensor operation.

Linear layers: compute what nn.Linear computes (to float32 rounding),
route only plain float32 CPU nn.Linear layers, put every layer back after
the block (also after an exception), refuse bad modes by name, and serve
every forward of the native loop (and none with ``linear_kernel="torch"``).
Token identity of the loop with either kernel is in test_hf_exactness.py.
Across threads: oneDNN serves only the threads inside a block, the layers
keep their routed forward until the last block (any thread, any kernel
object) leaves, blocks nest, and "auto"'s decisions are bounded (LRU).

Shared heads, on a tiny Llama whose 4 query heads share 2 key/value heads:
a forward over several new tokens after a cached prompt gives bit-identical
logits with and without the switch, without transformers' repeat_kv copies
while it is active; one-token forwards keep transformers' own path; the
switch is undone after an exception; pld's loop runs inside it. Across
threads: the switch acts only in a thread inside the block, stays in place
until the last block (in any thread) leaves, and nests.
"""
from __future__ import annotations

import collections
import copy
import inspect
import random
import subprocess
import sys
import threading

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

torch = pytest.importorskip("torch")
nn = torch.nn

from pld import cpu_kernels as ck  # noqa: E402

sdpa = pytest.importorskip("transformers.integrations.sdpa_attention")
_ORIGINAL = sdpa.use_gqa_in_sdpa

needs_onednn = pytest.mark.skipif(not ck.onednn_available(),
                                  reason="this torch build has no oneDNN linear")

WAIT = 60  # seconds a thread waits for another before the test fails


def _in_threads(*targets):
    mf.in_threads(*targets, wait=WAIT)


# -- entry ------------------------------------------------------------------

_IMPORT_CHECK = """
import importlib, pkgutil
import torch
from torch.utils._python_dispatch import TorchDispatchMode

ops = []

class Record(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ops.append(str(func))
        return func(*args, **(kwargs or {}))

with Record():
    import pld
    assert ops == [], ops
    pld.enable, pld.generate, pld.Corpus  # the modules its lazy names load
    for m in pkgutil.walk_packages(pld.__path__, "pld."):
        if not m.name.startswith(("pld.bench", "pld.__main__")):
            importlib.import_module(m.name)
    torch.zeros(1)  # (the recorder records)
assert len(ops) == 1 and "zeros" in ops[0], ops
from pld import cpu_kernels as ck
assert ck._torch_has_gqa.cache_info().currsize == 0, "an SDPA probe ran at import"
assert not ck._PROBED, "the oneDNN probe ran at import"
print(pld.DecodeConfig.__name__)
"""


def test_importing_pld_runs_no_tensor_operation():
    """``import pld``, the modules its lazy names load and every other
    module of pld (the bench aside) run no tensor operation: a dispatch
    mode set up before the import records none."""
    out = subprocess.run([sys.executable, "-c", _IMPORT_CHECK], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "DecodeConfig"


class _Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every aten operation run inside it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _spy_machinery(monkeypatch) -> list:
    """The name of every probe and measurement of the CPU machinery called
    from now on (each wrapped; the test's monkeypatch restores them)."""
    called = []
    for name in ("onednn_available", "onednn_pays", "measure", "_torch_has_gqa", "_sdpa_module"):
        real = getattr(ck, name)

        def spy(*args, _name=name, _real=real, **kwargs):
            called.append(_name)
            return _real(*args, **kwargs)
        monkeypatch.setattr(ck, name, spy)
    return called


def _untouched(model, called, ops) -> dict:
    """What the machinery left in place: probes called, aten ops run,
    layers routed, transformers' switch patched."""
    return {"called": called, "ops": ops, "routed": [n for n, m in model.named_modules() if "forward" in vars(m)],
            "patched": sdpa.use_gqa_in_sdpa is not _ORIGINAL}


_NOTHING = {"called": [], "ops": [], "routed": [], "patched": False}


@pytest.mark.parametrize("mode", ["auto", "onednn"])
def test_nothing_runs_for_a_model_on_meta(mode, monkeypatch):
    """A model on ``meta``: entering the CPU machinery probes no kernel,
    runs no tensor operation, routes no layer, leaves transformers'
    ``use_gqa_in_sdpa`` as it is (and "onednn" refuses nothing)."""
    model = copy.deepcopy(mf.tiny_model("llama")).to("meta")
    assert next(model.parameters()).device.type == "meta"
    called = _spy_machinery(monkeypatch)
    with _Recorder() as recorder, ck.cpu_kernels(model, mode):
        inside = _untouched(model, called, recorder.ops)
    assert inside == _NOTHING


def _says_cuda(model):
    """``model`` (a copy, on the CPU) whose ``device`` says CUDA, as a model
    on a GPU does."""
    fake = copy.deepcopy(model)
    fake.__class__ = type("OnFakeCuda", (type(model),), {"device": property(lambda self: torch.device("cuda"))})
    return fake


@pytest.mark.parametrize("mode", ["auto", "onednn"])
def test_nothing_runs_for_a_model_on_a_gpu(mode, monkeypatch):
    """The adapter's kernels() for a model that says it is on CUDA (its
    weights are on the CPU, so any machinery entered would show): no
    probe, no tensor operation, no routed layer, no switch."""
    from pld import hf_adapter

    cpu_model = mf.tiny_model("llama")
    model = _says_cuda(cpu_model)
    assert model.device.type == "cuda"
    adapter = hf_adapter.TransformersAdapter(model, hf_adapter._fresh_cache(cpu_model), mode,
                                             traits=hf_adapter.model_traits(cpu_model))
    called = _spy_machinery(monkeypatch)
    with _Recorder() as recorder, adapter.kernels():
        inside = _untouched(model, called, recorder.ops)
    assert inside == _NOTHING


def test_a_whole_run_enters_the_machinery_only_on_the_cpu(monkeypatch):
    """A whole ``pld.generate`` on the tests' device (models_fixtures.DEVICE:
    the CPU unless PLD_TEST_DEVICE names a GPU), seen from inside every
    forward. On the CPU the shared-heads switch is in place for the
    decoding forwards (the positive control); anywhere else no probe of the machinery is called,
    no layer is routed and transformers' switch is its own, and the tokens
    are greedy's on that device."""
    import pld

    model = copy.deepcopy(mf.tiny_model("llama")).to(mf.DEVICE)
    ids = mf.as_ids(mf.repeated_prompt(random.Random("machinery"), min_len=20)).to(mf.DEVICE)
    expected = mf.greedy(model, ids, 16)
    called = _spy_machinery(monkeypatch)
    seen = []
    hook = model.register_forward_pre_hook(lambda module, args: seen.append(_untouched(model, [], [])))
    try:
        tokens = pld.generate(model, ids, max_new_tokens=16, prompt_lookup_num_tokens=4).new_tokens
    finally:
        hook.remove()
    assert tokens == expected and seen
    if torch.device(mf.DEVICE).type == "cpu":
        # the probes' forwards come first; the decoding forwards run inside it
        assert "_sdpa_module" in called and seen[-1]["patched"]
    else:
        assert called == [] and all(s == _NOTHING for s in seen)
    assert _untouched(model, [], []) == _NOTHING


@needs_onednn
def test_the_adapter_enters_both_for_a_model_on_the_cpu(monkeypatch):
    """The positive control: on the CPU the adapter's kernels() routes the
    linear layers and installs the shared-heads switch, and undoes both."""
    from pld import hf_adapter

    model = mf.tiny_model("llama")
    adapter = hf_adapter.TransformersAdapter(model, hf_adapter._fresh_cache(model), "onednn")
    called = _spy_machinery(monkeypatch)
    with adapter.kernels():
        inside = _untouched(model, called, [])
    assert "onednn_available" in inside["called"] and "_torch_has_gqa" in inside["called"]
    assert inside["routed"] and inside["patched"]
    assert _untouched(model, [], []) == _NOTHING

# -- linear layers ------------------------------------------------------------

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
    real = ck._OP

    def counting(x, *args):
        widths.append(x.shape[-2])
        return real(x, *args)

    monkeypatch.setattr(ck, "_OP", counting)
    return widths


@needs_onednn
def test_routed_layers_compute_what_nn_linear_computes():
    model = _toy()
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        expected = model(x)
        wide = ck.LinearKernel(model, "onednn")
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
    wide = ck.LinearKernel(model, "onednn")
    assert wide.layers == [model[0], model[2]]  # not the subclass with its own forward
    assert not ck.LinearKernel(_toy().double()).active
    assert "float32" in ck.LinearKernel(_toy().double()).reason


@needs_onednn
def test_layers_are_restored_after_an_exception():
    model = _toy()
    wide = ck.LinearKernel(model, "onednn")
    with pytest.raises(RuntimeError, match="boom"):
        with wide.routing():
            raise RuntimeError("boom")
    assert not any("forward" in vars(m) for m in model.modules())


def test_bad_modes_are_refused_by_name():
    import pld

    with pytest.raises(ValueError, match="linear_kernel"):
        ck.LinearKernel(_toy(), "fast")
    with pytest.raises(ValueError, match="linear_kernel"):
        pld.enable(linear_kernel="fast")
    assert not pld.is_enabled()
    ids = mf.as_ids([1, 2, 3, 1, 2])
    for bad in ("fast", None, 1):
        with pytest.raises(ValueError, match="linear_kernel"):
            pld.generate(mf.tiny_model("llama"), ids, max_new_tokens=2, linear_kernel=bad)
    with pytest.raises(ValueError, match="linear_kernel='onednn' cannot be used"):
        ck.LinearKernel(_toy().double(), "onednn")
    plain = ck.LinearKernel(_toy(), "torch")
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
    layers = ck.LinearKernel(model, "onednn").layers
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

    monkeypatch.setattr(ck, "measure", fake_measure)
    monkeypatch.setattr(ck, "_DECISIONS", collections.OrderedDict())
    model = _toy()
    for _ in range(3):
        kernel = ck.LinearKernel(model)
        assert kernel.active == routes
        assert routes or "measured" in kernel.reason
    assert calls == [2]  # once, over the two routable layers
    assert ck.LinearKernel(model, "onednn").active  # an explicit choice is kept


@needs_onednn
def test_measure_times_both_kernels_over_every_layer(monkeypatch):
    seen = _count_onednn_widths(monkeypatch)
    layers = ck.LinearKernel(_toy(), "onednn").layers
    t_torch, t_onednn = ck.measure(layers, repeats=2)
    assert t_torch > 0 and t_onednn > 0
    # warm-up + 2 rounds, every width, every layer
    assert sorted(seen) == sorted([w for _ in range(3) for w in ck.WIDTHS for _ in layers])


# -- linear layers: threads --------------------------------------------------

def _onednn_threads(monkeypatch) -> list:
    """The thread of every oneDNN product from now on."""
    threads = []
    real = ck._OP

    def recording(*args):
        threads.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(ck, "_OP", recording)
    return threads


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
        with ck.LinearKernel(model, "onednn").routing():
            both_in.wait()
        a_left.set()

    def b():
        kernel = ck.LinearKernel(model, "onednn")
        with kernel.routing():
            both_in.wait()
            assert a_left.wait(WAIT)
            # a kernel made while B routes finds the same layers
            seen["layers"] = ck.LinearKernel(model, "onednn").layers == kernel.layers
            with torch.no_grad():
                got = model(x)
            seen["b"] = (calls.count(threading.get_ident()), all("forward" in vars(m) for m in kernel.layers))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)

    _in_threads(a, b)
    assert seen == {"layers": True, "b": (2, True)}  # both routed layers, on B's thread
    assert not any("forward" in vars(m) for m in model.modules())
    assert ck._LAYER_USERS.get(model[0]) is None


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
        with ck.LinearKernel(model, "onednn").routing():
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
    kernel = ck.LinearKernel(model, "onednn")
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

    monkeypatch.setattr(ck, "measure", fake_measure)
    monkeypatch.setattr(ck, "_DECISIONS", collections.OrderedDict())
    monkeypatch.setattr(ck, "MAX_DECISIONS", 2)
    layers = {n: [nn.Linear(n, 4)] for n in (1, 2, 3)}
    for n in (1, 2, 1, 3):  # 1 again: a hit, so 2 is the oldest when 3 comes
        assert ck.onednn_pays(layers[n])
    assert measured == [1, 2, 3]
    assert len(ck._DECISIONS) == 2
    ck.onednn_pays(layers[1])
    assert measured == [1, 2, 3]
    ck.onednn_pays(layers[2])  # evicted: measured again
    assert measured == [1, 2, 3, 2]


# -- shared heads -------------------------------------------------------------

@pytest.fixture
def repeat_calls(monkeypatch):
    calls = []
    real = sdpa.repeat_kv

    def counting(hidden_states, n_rep):
        calls.append(tuple(hidden_states.shape))
        return real(hidden_states, n_rep)

    monkeypatch.setattr(sdpa, "repeat_kv", counting)
    return calls


def _forward(model, prompt, new):
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=prompt, **mf.cache_kw(model, cache), use_cache=True)
        ids = torch.cat([prompt, new], dim=1)
        out = model(input_ids=new, **mf.cache_kw(model, cache), use_cache=True,
                    attention_mask=torch.ones_like(ids))
    return out.logits


@pytest.mark.parametrize("width", [2, 5, 11])
def test_same_logits_without_copies(width, repeat_calls):
    model = mf.tiny_model("llama")
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    gen = torch.Generator().manual_seed(width)
    prompt = torch.randint(0, mf.PROMPT_VOCAB, (1, 40), generator=gen)
    new = torch.randint(0, mf.PROMPT_VOCAB, (1, width), generator=gen)
    expected = _forward(model, prompt, new)
    assert repeat_calls, "transformers copies the shared heads here (else this tests nothing)"
    repeat_calls.clear()
    with ck.shared_kv_heads() as active:
        got = _forward(model, prompt, new)
    assert active
    assert repeat_calls == []
    assert torch.equal(got, expected)


def test_one_token_forwards_keep_transformers_path(monkeypatch):
    asked = []
    original = sdpa.use_gqa_in_sdpa

    def spy(*args):
        asked.append(original(*args))
        return asked[-1]

    monkeypatch.setattr(sdpa, "use_gqa_in_sdpa", spy)
    model = mf.tiny_model("llama")
    prompt = torch.randint(0, mf.PROMPT_VOCAB, (1, 30))
    # transformers 4.57 asks (attention_mask, key), 5.x (attention_mask, key, value)
    arity = len(inspect.signature(original).parameters)
    with ck.shared_kv_heads():
        patched = sdpa.use_gqa_in_sdpa

        def ask(mask, key, value):
            return patched(*(mask, key, value)[:arity])

        mask = torch.ones(1, 1, 1, 31, dtype=torch.bool)
        key = torch.zeros(1, 2, 31, 8)
        assert ask(mask, key, key) == original(*(mask, key, key)[:arity])  # one query token
        wide = torch.ones(1, 1, 3, 33, dtype=torch.bool)
        assert ask(wide, key, key) is True                                 # several
        if arity == 3:
            assert ask(wide, key, key[..., :4]) is False                   # head dims differ
        _forward(model, prompt, prompt[:, :1])
    assert sdpa.use_gqa_in_sdpa is spy


def test_undone_after_an_exception():
    before = sdpa.use_gqa_in_sdpa
    with pytest.raises(RuntimeError, match="boom"):
        with ck.shared_kv_heads():
            assert sdpa.use_gqa_in_sdpa is not before
            raise RuntimeError("boom")
    assert sdpa.use_gqa_in_sdpa is before


def test_the_loop_reads_shared_heads_in_place(repeat_calls):
    from transformers import DynamicCache

    from pld import loop

    model = mf.tiny_model("llama")
    rng = random.Random("gqa-loop")
    drafted = 0
    for _ in range(4):
        ids = mf.as_ids(mf.repeated_prompt(rng))
        with torch.no_grad():
            result = loop.run(model, ids, cache=DynamicCache(), max_new_tokens=16, prompt_lookup_num_tokens=4,
                              record_steps=True, cost_aware=False)  # every draft: wide forwards
        drafted += sum(1 for r in result.stats.records[1:] if r.proposed)
    assert drafted > 0
    assert repeat_calls == []


# -- shared heads: threads ----------------------------------------------------

def _ask_wide() -> bool:
    """What transformers' attention (its module function, looked up now)
    answers for a three-token query with a mask over shared CPU heads:
    False from transformers itself, True from the switch."""
    arity = len(inspect.signature(_ORIGINAL).parameters)
    mask = torch.ones(1, 1, 3, 33, dtype=torch.bool)
    key = torch.zeros(1, 2, 33, 8)
    return sdpa.use_gqa_in_sdpa(*(mask, key, key)[:arity])



def test_the_switch_outlives_a_thread_that_leaves_first():
    """A enters, B enters, A leaves while B is inside: B still gets the
    switch; after both, transformers' function is the original again."""
    assert not _ask_wide()
    both_in = threading.Barrier(2, timeout=WAIT)
    a_left = threading.Event()
    seen = {}

    def a():
        with ck.shared_kv_heads() as active:
            assert active
            both_in.wait()
            seen["a"] = _ask_wide()
        a_left.set()

    def b():
        with ck.shared_kv_heads():
            both_in.wait()
            assert a_left.wait(WAIT)
            seen["b_after_a"] = _ask_wide()
            seen["installed"] = sdpa.use_gqa_in_sdpa is not _ORIGINAL

    _in_threads(a, b)
    assert seen == {"a": True, "b_after_a": True, "installed": True}
    assert sdpa.use_gqa_in_sdpa is _ORIGINAL
    assert not _ask_wide()


def test_a_thread_outside_keeps_transformers_path(repeat_calls):
    """While thread A is inside, another thread gets transformers' own
    answer and its forwards copy the heads as transformers does."""
    model = mf.tiny_model("llama")
    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, mf.PROMPT_VOCAB, (1, 30), generator=gen)
    new = torch.randint(0, mf.PROMPT_VOCAB, (1, 4), generator=gen)
    expected = _forward(model, prompt, new)
    a_in, outside_done = threading.Event(), threading.Event()
    seen = {}

    def a():
        with ck.shared_kv_heads():
            a_in.set()
            assert outside_done.wait(WAIT)
            repeat_calls.clear()
            seen["inside"] = (_ask_wide(), torch.equal(_forward(model, prompt, new), expected),
                              len(repeat_calls))

    def outside():
        assert a_in.wait(WAIT)
        try:
            repeat_calls.clear()
            seen["outside"] = (_ask_wide(), torch.equal(_forward(model, prompt, new), expected),
                               len(repeat_calls) > 0)
            seen["installed"] = sdpa.use_gqa_in_sdpa is not _ORIGINAL
        finally:
            outside_done.set()

    _in_threads(a, outside)
    assert seen == {"outside": (False, True, True), "installed": True, "inside": (True, True, 0)}
    assert sdpa.use_gqa_in_sdpa is _ORIGINAL


def test_nested_blocks_in_one_thread():
    with ck.shared_kv_heads():
        with ck.shared_kv_heads():
            assert _ask_wide()
        assert _ask_wide()  # the outer block still holds it
        assert sdpa.use_gqa_in_sdpa is not _ORIGINAL
    assert sdpa.use_gqa_in_sdpa is _ORIGINAL
    assert not _ask_wide()
