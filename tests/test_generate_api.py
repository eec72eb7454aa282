"""pld.generate: input checking, the statistics it returns, render()."""
from __future__ import annotations

import random

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def model():
    return mf.tiny_model("gpt2")


@pytest.fixture(scope="module")
def ids():
    return mf.as_ids([1, 2, 3, 4, 1, 2, 3, 4, 1, 2])


# ------------------------------------------------------------ bad input
@pytest.mark.parametrize("ids, mask, match", [
    ([[1, 2, 3], [1, 2, 3]], [[1, 1], [1, 1]], "attention_mask"),        # mismatched shape
    ([[1, 2, 0], [1, 2, 3]], [[1, 1, 0], [1, 1, 1]], "left padding"),   # right padding
    ([[0, 2, 3], [1, 2, 3]], [[1, 0, 1], [1, 1, 1]], "left padding"),   # a hole
    ([[1, 2, 3], [1, 2, 3]], [[1, 1, 2], [1, 1, 1]], "attention_mask"),  # not 0/1
])
def test_batch_bad_masks_are_value_errors(model, ids, mask, match):
    import torch

    import pld

    with pytest.raises(ValueError, match=match):
        pld.generate(model, torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=4)


def test_empty_batch_and_batch_streamer_are_value_errors(model):
    import torch

    import pld

    with pytest.raises(ValueError, match="input_ids"):
        pld.generate(model, torch.zeros((0, 3), dtype=torch.long), max_new_tokens=4)
    with pytest.raises(ValueError, match="streamer"):
        pld.generate(model, torch.tensor([[1, 2], [3, 4]]), max_new_tokens=4, on_step=print)


@pytest.mark.parametrize("name", ["prompt_lookup_num_tokens", "max_matching_ngram_size", "min_ngram_size"])
def test_zero_sizes_are_value_errors_naming_the_argument(model, ids, name):
    import pld

    with pytest.raises(ValueError, match=name):
        pld.generate(model, ids, max_new_tokens=4, **{name: 0})


def test_negative_max_new_tokens(model, ids):
    import pld

    with pytest.raises(ValueError, match="max_new_tokens"):
        pld.generate(model, ids, max_new_tokens=-1)


@pytest.mark.parametrize("name", ["max_new_tokens", "prompt_lookup_num_tokens"])
@pytest.mark.parametrize("value", [2.0, "3", True, None])
def test_non_int_sizes_are_type_errors(model, ids, name, value):
    import pld

    with pytest.raises(TypeError, match=name):
        pld.generate(model, ids, **{name: value})


@pytest.mark.parametrize("dtype", ["float32", "float64", "bool"])
def test_non_integer_ids_are_type_errors(model, dtype):
    import torch

    import pld

    bad = torch.tensor([[1, 2, 3, 1, 2]]).to(getattr(torch, dtype))
    with pytest.raises(TypeError, match="integer"):
        pld.generate(model, bad, max_new_tokens=4)


@pytest.mark.parametrize("shape", [(1, 0), (0,)])
def test_empty_prompt_is_a_value_error(model, shape):
    import torch

    import pld

    with pytest.raises(ValueError, match="empty"):
        pld.generate(model, torch.zeros(shape, dtype=torch.long), max_new_tokens=4)


@pytest.mark.parametrize("value", [[[1, 2, 3]], (1, 2, 3), "1 2 3", None])
def test_non_tensor_ids_are_type_errors(model, value):
    import pld

    with pytest.raises(TypeError, match="tensor"):
        pld.generate(model, value, max_new_tokens=4)


def test_numpy_ids_are_type_errors(model):
    import numpy as np

    import pld

    with pytest.raises(TypeError, match="tensor"):
        pld.generate(model, np.array([[1, 2, 3]]), max_new_tokens=4)


def test_three_dimensional_ids_are_value_errors(model):
    import torch

    import pld

    with pytest.raises(ValueError, match="shape"):
        pld.generate(model, torch.ones((1, 1, 3), dtype=torch.long), max_new_tokens=4)


@pytest.mark.parametrize("kw", [dict(temperature=0.7), dict(top_k=5), dict(top_p=0.9)])
def test_warpers_without_do_sample_are_value_errors(model, ids, kw):
    import pld

    with pytest.raises(ValueError, match="do_sample"):
        pld.generate(model, ids, max_new_tokens=4, **kw)


def test_encoder_decoder_model_is_refused(ids):
    import pld

    class FakeSeq2Seq:
        class config:  # noqa: N801 - mimics a transformers config
            is_encoder_decoder = True

    with pytest.raises(ValueError, match="encoder-decoder"):
        pld.generate(FakeSeq2Seq(), ids, max_new_tokens=4)


def test_accepted_id_forms(model):
    """1-D ids, int32 ids: the same tokens as [1, L] int64."""
    import torch

    import pld

    ref = pld.generate(model, mf.as_ids([5, 6, 7, 5, 6]), max_new_tokens=8, eos_token_id=None)
    for form in (torch.tensor([5, 6, 7, 5, 6]), torch.tensor([[5, 6, 7, 5, 6]], dtype=torch.int32)):
        gen = pld.generate(model, form, max_new_tokens=8, eos_token_id=None)
        assert gen.new_tokens == ref.new_tokens
        assert gen.sequences.dtype == torch.long and gen.sequences.shape == (1, 13)
        assert gen.prompt_length == 5


# ------------------------------------------------------------ stats
@pytest.mark.parametrize("arch", mf.ALL_ARCHS)
def test_stats_are_consistent(arch):
    import pld

    model = mf.tiny_model(arch)
    rng = random.Random(f"stats-{arch}")
    seen_steps = []
    for _ in range(10):
        prompt = mf.repeated_prompt(rng)
        n_new = rng.randint(1, 30)
        eos = rng.choice([None, rng.randrange(mf.PROMPT_VOCAB)])
        seen = []
        gen = pld.generate(model, mf.as_ids(prompt), max_new_tokens=n_new,
                           prompt_lookup_num_tokens=rng.randint(1, 8), eos_token_id=eos, on_step=seen.append)
        s = gen.stats
        records = s.records
        assert seen == records  # on_step saw every step, in order
        assert gen.sequences[0, :len(prompt)].tolist() == prompt
        assert gen.prompt_length == len(prompt)
        assert s.new_tokens == len(gen.new_tokens) == sum(len(r.tokens) for r in records)
        assert [t for r in records for t in r.tokens] == gen.new_tokens
        assert s.steps == len(records)
        assert s.proposed_tokens == sum(r.proposed for r in records)
        assert s.accepted_draft_tokens == sum(r.accepted for r in records)
        assert 0 <= s.accepted_draft_tokens <= s.proposed_tokens
        for r in records:
            assert 0 <= r.accepted <= r.proposed
            assert r.accepted <= len(r.tokens) <= r.accepted + 1
        assert s.new_tokens <= n_new
        if eos is None or eos not in gen.new_tokens:
            assert s.new_tokens == n_new
        else:
            assert gen.new_tokens.index(eos) == s.new_tokens - 1
        assert s.tokens_per_step == pytest.approx(s.new_tokens / s.steps)
        if s.proposed_tokens:
            assert s.acceptance_rate == pytest.approx(s.accepted_draft_tokens / s.proposed_tokens)
        assert 0 <= s.forward_seconds <= s.total_seconds
        assert 0 <= s.forward_share <= 1
        assert s.tokens_per_second > 0
        seen_steps.append(s.steps)
    assert seen_steps


# ------------------------------------------------------------ render
class FakeTokenizer:
    """decode() maps id i to a letter; id 0 is a 'special' token skipped
    with skip_special_tokens, as a real tokenizer would."""

    def decode(self, ids, skip_special_tokens=False, **kwargs):
        return "".join("" if (i == 0 and skip_special_tokens) else chr(ord("a") + int(i) % 26)
                       for i in ids)


def _generation(tokens_per_step, prompt=(9, 9)):
    """A Generation with hand-made step records."""
    import torch

    from pld import loop
    from pld.generate import Generation

    stats = loop.LoopStats()
    for tokens in tokens_per_step:
        stats.records.append(loop.StepRecord(proposed=max(0, len(tokens) - 1),
                                             accepted=len(tokens) - 1, tokens=list(tokens)))
    flat = [t for tokens in tokens_per_step for t in tokens]
    stats.steps, stats.new_tokens = len(tokens_per_step), len(flat)
    return Generation(sequences=torch.tensor([list(prompt) + flat]), prompt_length=len(prompt), stats=stats)


def test_render_plain_is_the_decoded_output():
    tok = FakeTokenizer()
    for steps in ([[1], [2, 3, 4], [5]], [[1], [2]], [[3, 0, 4], [0], [6, 7]], []):
        gen = _generation(steps)
        assert gen.render(tok, mode="plain") == tok.decode(gen.new_tokens, skip_special_tokens=True)


def test_render_ansi_colours_only_multi_token_steps():
    tok = FakeTokenizer()
    single = _generation([[1], [2], [3]])
    out = single.render(tok, mode="ansi")
    assert "\033[" not in out and out == "bcd"
    multi = _generation([[1], [2, 3], [4], [5, 6, 7]])
    out = multi.render(tok, mode="ansi")
    assert "\033[" in out
    assert out == "b\033[31mcd\033[0me\033[32mfgh\033[0m"
    # stripped of its colour codes, the text is the plain text
    import re

    assert re.sub("\033\\[[0-9;]*m", "", out) == multi.render(tok, mode="plain")


def test_render_html_and_bad_mode():
    tok = FakeTokenizer()
    gen = _generation([[1], [2, 3]])
    out = gen.render(tok, mode="html")
    assert out.startswith("<pre") and "<span" in out and "cd" in out
    assert "<span" not in _generation([[1], [2]]).render(tok, mode="html")
    with pytest.raises(ValueError, match="mode"):
        gen.render(tok, mode="rainbow")


def test_render_of_a_real_generation(model):
    import pld

    tok = FakeTokenizer()
    for prompt in ([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [7, 8, 9, 10, 11]):
        gen = pld.generate(model, mf.as_ids(prompt), max_new_tokens=24, eos_token_id=None)
        assert gen.render(tok, mode="plain") == tok.decode(gen.new_tokens, skip_special_tokens=True)
        ansi = gen.render(tok, mode="ansi")
        has_multi = any(len(r.tokens) > 1 for r in gen.stats.records)
        assert ("\033[" in ansi) == has_multi


def test_the_type_stub_names_what_import_pld_gives():
    """pld/__init__.pyi (what type checkers read) imports every public name
    from the module that defines it, and names every attribute ``import
    pld`` gives: the eager ones, the lazy ones and the submodules."""
    import ast
    import importlib
    import types
    from pathlib import Path

    import pld

    stub = ast.parse((Path(pld.__file__).parent / "__init__.pyi").read_text())
    named = set()
    for node in stub.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:  # (not `from typing import ...`)
            module = importlib.import_module(f"pld.{node.module}" if node.module else "pld")
            for alias in node.names:
                assert hasattr(module, alias.name), (node.module, alias.name)
                named.add(alias.asname or alias.name)
        elif isinstance(node, ast.AnnAssign):
            named.add(node.target.id)
    public = {n for n, v in vars(pld).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    public |= set(pld._LAZY) | set(pld._SUBMODULES) | {"__version__"}
    assert public <= named, public - named
