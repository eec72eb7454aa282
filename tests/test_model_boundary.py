"""The model boundary, decided once (pld.hf_adapter.decide), and the short
path from ``model.generate`` to the step.

A run decides once what the model and the batch allow -- the padding mask,
the cache, eos and pad, the vocabulary, trees or linear drafts, a batch at
once or row by row -- builds its draft sources once, and steps. The tests
count the calls of a real generate() under pld.enable(), read the call
stack at the first step, and check that draft sources share a row's
memory only as they declare.
"""
from __future__ import annotations

import inspect
import os
import sys

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

PLD_DIR = os.path.dirname(os.path.abspath(__import__("pld").__file__))


def _batch():
    import torch

    ids = torch.tensor([[mf.PAD, 5, 6, 7, 5, 6], [1, 2, 5, 6, 7, 5]])
    return ids, torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])


def _calls_in_pld(fn):
    """fn() with every call of a pld function counted by (file, name)."""
    counts: dict = {}

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PLD_DIR):
            key = (os.path.relpath(frame.f_code.co_filename, PLD_DIR), frame.f_code.co_name)
            counts[key] = counts.get(key, 0) + 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts


@pytest.mark.parametrize("tree", [False, True])
def test_a_generate_call_decides_and_builds_its_sources_once(tree):
    import torch

    import pld

    model = mf.tiny_model("llama")
    ids, mask = _batch()
    options = {"draft_tree": True} if tree else {}
    with pld.enabled(**options), torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=6, prompt_lookup_num_tokens=3, do_sample=False)
        counts = _calls_in_pld(lambda: model.generate(
            ids, attention_mask=mask, max_new_tokens=6, prompt_lookup_num_tokens=3, do_sample=False))
    assert counts[("hf_adapter.py", "decide")] == 1
    assert counts[("batch_inputs.py", "check_left_padded")] == 1
    assert counts[(os.path.join("drafts", "__init__.py"), "build")] == 1
    assert counts[("hf_adapter.py", "_loop_cache")] == 1
    assert counts[("decoder.py", "__init__")] == 1
    assert ("hf_adapter.py", "_probe") not in counts  # the model's traits: probed on its first use only


def test_generate_reaches_the_step_in_few_module_hops(monkeypatch):
    """From transformers' generate() to Decoder.step: at most 6 hops
    between modules, and no module visited twice."""
    import torch

    import pld
    from pld.decoder import Decoder

    stacks = []
    step = Decoder.step

    def recording(self):
        if not stacks:
            stacks.append([f.frame.f_globals.get("__name__") for f in inspect.stack()[1:]][::-1])
        return step(self)

    monkeypatch.setattr(Decoder, "step", recording)
    model = mf.tiny_model("llama")
    ids, mask = _batch()
    with pld.enabled(), torch.no_grad():
        model.generate(ids[1:], max_new_tokens=3, prompt_lookup_num_tokens=3, do_sample=False)
    stack = stacks[0]
    start = max(i for i, name in enumerate(stack) if name == "transformers.generation.utils")
    modules = [name for i, name in enumerate(stack[start:]) if i == 0 or name != stack[start + i - 1]]
    modules.append("pld.decoder")
    assert len(modules) - 1 <= 6, modules
    assert len(set(modules)) == len(modules), modules  # no module twice
    assert modules[:2] == ["transformers.generation.utils", "pld.from_generate"], modules


def test_the_pad_id_is_the_callers_else_the_models_else_the_first_eos(monkeypatch):
    import torch

    from pld.config import DecodeConfig
    from pld.hf_adapter import decide

    model = mf.tiny_model("llama")
    ids, mask = _batch()
    config = DecodeConfig(eos_token_id=[9, 3])
    assert decide(model, ids, config, False, attention_mask=mask, pad_token_id=4).pad == 4
    assert decide(model, ids, config, False, attention_mask=mask).pad == mf.PAD
    monkeypatch.setattr(model.generation_config, "pad_token_id", None)
    assert decide(model, ids, config, False, attention_mask=mask).pad == 9  # generate()'s choice
    assert decide(model, ids, DecodeConfig(eos_token_id=None), False, attention_mask=mask).pad == 0
    with pytest.raises(ValueError, match="attention_mask"):
        decide(model, ids, config, False, attention_mask=mask[:, :3])


def test_tf32_products_are_read_from_torchs_setting():
    """A float32 model on CUDA whose products run in TF32 rounds like half
    precision: read from torch's setting (the old API here: the new one
    reflects it), for CUDA and float32 alone."""
    import torch

    from pld.hf_adapter import tf32_products

    cuda, matmul = torch.device("cuda"), torch.backends.cuda.matmul
    before = matmul.allow_tf32
    try:
        matmul.allow_tf32 = False
        assert not tf32_products(cuda, torch.float32)
        matmul.allow_tf32 = True
        assert tf32_products(cuda, torch.float32)
        assert not tf32_products(cuda, torch.bfloat16) and not tf32_products(torch.device("cpu"), torch.float32)
    finally:
        matmul.allow_tf32 = before


def test_greedy_under_tf32_warns_once(monkeypatch, caplog):
    import logging

    import torch

    import pld
    from pld import hf_adapter

    seen = []
    monkeypatch.setattr(hf_adapter, "tf32_products", lambda device, dtype: seen.append((device, dtype)) or True)
    monkeypatch.setattr(hf_adapter, "_tf32_warned", False)
    caplog.set_level(logging.WARNING, logger="pld")
    model = mf.tiny_model("llama")
    ids = torch.tensor([[5, 6, 7, 5, 6]])
    for _ in range(2):
        pld.generate(model, ids, max_new_tokens=3, eos_token_id=None)
    assert seen == [(ids.device, torch.float32)] * 2
    assert sum("TF32" in r.getMessage() for r in caplog.records) == 1
    monkeypatch.setattr(hf_adapter, "_tf32_warned", False)
    pld.generate(model, ids, max_new_tokens=3, eos_token_id=None, do_sample=True)
    assert sum("TF32" in r.getMessage() for r in caplog.records) == 1  # sampling: not greedy's tokens anyway


def test_a_source_that_reads_memory_no_source_writes_is_refused():
    from pld import drafts
    from pld.config import DecodeConfig

    with pytest.raises(ValueError, match="'ahead' reads row memory \\['successors'\\].*add 'successors'"):
        DecodeConfig(draft_sources=("prompt_tree", "ahead"))
    with pytest.raises(ValueError, match="'ahead'"):
        drafts.build(("prompt_tree", "ahead"), DecodeConfig())
    assert len(drafts.build(("prompt_tree", "ahead", "successors"), DecodeConfig())) == 3


def test_sources_touch_only_the_row_memory_they_declare(monkeypatch):
    """Every read and write of a row's memory during a batch with every
    memory-keeping source, attributed to the source that made it."""
    import torch

    import pld
    from pld import drafts
    from pld.row_state import Row

    touched: dict = {}
    current: list = []

    class Recording(dict):
        def _note(self, key):
            touched.setdefault(current[-1] if current else None, set()).add(key)

        def __getitem__(self, key):
            self._note(key)
            return super().__getitem__(key)

        def __setitem__(self, key, value):
            self._note(key)
            super().__setitem__(key, value)

        def get(self, key, default=None):
            self._note(key)
            return super().get(key, default)

    init = Row.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.memory = Recording()

    monkeypatch.setattr(Row, "__init__", recording_init)
    for name, (cls, _) in drafts.REGISTRY.items():
        for method in ("propose", "observe"):
            def wrapped(self, *args, _name=name, _original=getattr(cls, method), **kwargs):
                current.append(_name)
                try:
                    return _original(self, *args, **kwargs)
                finally:
                    current.pop()
            monkeypatch.setattr(cls, method, wrapped)

    model = mf.tiny_model("llama")
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]] * 2)
    pld.generate(model, ids, max_new_tokens=8, prompt_lookup_num_tokens=3, eos_token_id=None,
                 draft_tree=True, draft_sources=("prompt_tree", "ahead", "successors", "siblings"))
    assert touched.get("successors") and touched.get("ahead") and touched.get("siblings"), touched
    for name, keys in touched.items():
        assert name is not None, f"row memory {keys} touched outside any source"
        declared = set(drafts.REGISTRY[name][0].reads) | set(drafts.REGISTRY[name][0].writes)
        assert keys <= declared, (name, keys, declared)
