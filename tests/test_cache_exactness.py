"""The KV cache after every step, seen through the logits (float32).

The tiny random models of test_hf_exactness hardly depend on the context,
so a cache that keeps one rejected draft entry, or loses one accepted
entry, still gives greedy's tokens there. Here, on context-sensitive
variants (``models_fixtures.sharp_model``: sharp attention that outweighs
the current token), pld's raw logits must equal plain greedy decoding's at
every generated position (atol = rtol = 1e-4), through ``pld.loop.run`` and
through ``model.generate(prompt_lookup_num_tokens=...)`` with pld enabled,
over many prompts with repeated spans (so drafts are both accepted and
rejected), several draft lengths, n-gram sizes and budgets. The loop's own
check (``pld.loop.DEBUG_CHECKS``, on in the test suite) is tested with a
cache whose crop is off by one.
"""
from __future__ import annotations

import os
import random

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

ATOL = RTOL = 1e-4
BATCHES = 4
PROMPTS_PER_BATCH = 12  # 4 batches x 12 prompts x 2 archs, each run 3 ways


def _changed_continuations(model, rng, n, back=20, new=16):
    """In how many of ``n`` prompts changing the token ``back`` positions
    from the end changes the greedy continuation of ``new`` tokens."""
    changed = 0
    for _ in range(n):
        prompt = mf.repeated_prompt(rng, min_len=30, max_len=60)
        other = list(prompt)
        pos = len(other) - back
        other[pos] = (other[pos] + rng.randrange(1, mf.PROMPT_VOCAB)) % mf.PROMPT_VOCAB
        assert other[pos] != prompt[pos]
        changed += mf.greedy(model, mf.as_ids(prompt), new) != mf.greedy(model, mf.as_ids(other), new)
    return changed


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_sharp_models_depend_on_the_context(arch):
    """One token 20 positions back changes most of the sharp model's greedy
    continuations, and more of them than the tiny model's."""
    n = 30
    sharp = _changed_continuations(mf.sharp_model(arch), random.Random(f"context-{arch}"), n)
    tiny = _changed_continuations(mf.tiny_model(arch), random.Random(f"context-{arch}"), n)
    assert sharp >= 0.7 * n, (sharp, tiny)
    assert sharp > tiny + 0.2 * n, (sharp, tiny)


def _prompt(model, rng):
    """Half the prompts end with the model's own greedy continuation of a
    repeated-span prefix (its drafts then get accepted), half are plain
    repeated-span prompts (mostly rejected drafts). A continuation may hold
    the pad id: plain decoding gets an explicit all-ones mask."""
    prefix = mf.repeated_prompt(rng, min_len=6, max_len=40)
    if rng.random() < 0.5:
        return prefix
    return prefix + mf.greedy(model, mf.as_ids(prefix), rng.randint(8, 24))


def _plain(model, ids, n_new):
    import torch

    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=n_new, eos_token_id=None,
                             output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, ids.shape[1]:].tolist(), out.logits


def _assert_same_logits(got, expected, where):
    import torch

    assert got is not None and len(got) == len(expected), where
    for j, (a, b) in enumerate(zip(got, expected)):
        assert a.shape == b.shape, dict(where, position=j)
        if not torch.allclose(a.float(), b.float(), atol=ATOL, rtol=RTOL):
            gap = (a.float() - b.float()).abs().max().item()
            raise AssertionError(f"logits differ at generated position {j} (max |diff| {gap:.3g}): {where}")


@pytest.mark.parametrize("arch", mf.ARCHS)
@pytest.mark.parametrize("batch", range(BATCHES))
def test_logits_equal_plain_decoding_at_every_position(arch, batch, monkeypatch):
    import torch
    from transformers import DynamicCache

    import pld
    from pld import loop

    model = mf.sharp_model(arch)
    rng = random.Random(f"cache-logits-{arch}-{batch}")
    counter = mf.install_counter(monkeypatch)
    steps_accepting = steps_rejecting = 0
    for i in range(PROMPTS_PER_BATCH):
        prompt = _prompt(model, rng)
        ids = mf.as_ids(prompt)
        n_new = [1, 2, rng.randint(3, 12), rng.randint(13, 40)][i % 4]
        expected, expected_logits = _plain(model, ids, n_new)
        k, ngram = rng.choice([1, 2, 3, 5, 8, 10]), rng.choice([1, 2, 3, 4])
        where = dict(prompt=prompt, n_new=n_new, k=k, ngram=ngram)

        with torch.no_grad():
            result = loop.run(model, ids, cache=DynamicCache(), max_new_tokens=n_new, prompt_lookup_num_tokens=k,
                              max_matching_ngram_size=ngram, output_logits=True, record_steps=True,
                              cost_aware=False)  # every draft: both crops
        assert result.sequences[0, len(prompt):].tolist() == expected, where
        _assert_same_logits(result.logits, expected_logits, where)
        steps_accepting += sum(r.accepted > 0 for r in result.stats.records)
        steps_rejecting += sum(r.accepted < r.proposed for r in result.stats.records)

        # the same through model.generate, with every draft verified
        k2, ngram2 = rng.choice([2, 4, 6]), rng.choice([1, 2, 3])
        with pld.enabled(cost_aware=False), torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=n_new, eos_token_id=None,
                                 prompt_lookup_num_tokens=k2, max_matching_ngram_size=ngram2,
                                 output_logits=True, return_dict_in_generate=True)
        where = dict(where, k=k2, ngram=ngram2, via="model.generate")
        assert out.sequences[0, len(prompt):].tolist() == expected, where
        _assert_same_logits(out.logits, expected_logits, where)
    assert counter.calls == 2 * PROMPTS_PER_BATCH  # model.generate was served by the native loop
    # both kinds of step happened, so both crops were exercised
    assert steps_accepting >= 3 and steps_rejecting >= 3, (steps_accepting, steps_rejecting)


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_adaptive_and_transformers_semantics_logits(arch):
    """The adaptive draft length and transformers' clipped continuations
    change which drafts are verified, never the logits."""
    import torch
    from transformers import DynamicCache

    from pld import loop

    model = mf.sharp_model(arch, seed=1)
    rng = random.Random(f"cache-variants-{arch}")
    for _ in range(4):
        prompt = _prompt(model, rng)
        ids = mf.as_ids(prompt)
        n_new = rng.randint(16, 32)
        expected, expected_logits = _plain(model, ids, n_new)
        for options in (dict(adaptive=True), dict(semantics="transformers", max_matching_ngram_size=2)):
            with torch.no_grad():
                result = loop.run(model, ids, cache=DynamicCache(), max_new_tokens=n_new,
                                  prompt_lookup_num_tokens=6, output_logits=True, **options)
            where = dict(prompt=prompt, n_new=n_new, **options)
            assert result.sequences[0, len(prompt):].tolist() == expected, where
            _assert_same_logits(result.logits, expected_logits, where)


def _off_by_one_cache(extra):
    """A DynamicCache whose crop removes ``extra`` more entries than asked
    (-1: keeps one rejected draft entry; +1: drops one accepted entry)."""
    from transformers import DynamicCache

    class OffByOne(DynamicCache):
        def crop(self, tokens_to_remove):
            assert tokens_to_remove < 0  # the loop removes entries
            super().crop(tokens_to_remove - extra)

    return OffByOne()


def _run_until_a_crop(model, extra, debug, monkeypatch):
    """Run the loop (``DEBUG_CHECKS`` = ``debug``) with an off-by-one cache
    on prompts until one rejects a draft before its last step (a crop that
    the next forward sees); return (ids, result)."""
    import torch

    from pld import loop

    monkeypatch.setattr(loop, "DEBUG_CHECKS", debug)
    rng = random.Random(f"off-by-one-{extra}")
    for _ in range(20):
        ids = mf.as_ids(mf.repeated_prompt(rng, min_len=20))
        cache = _off_by_one_cache(extra)
        with torch.no_grad():
            result = loop.run(model, ids, cache=cache, max_new_tokens=24, prompt_lookup_num_tokens=5,
                              output_logits=True, record_steps=True)
        if any(r.accepted < r.proposed for r in result.stats.records[:-1]):  # a crop before the end
            return ids, result
    raise AssertionError("no prompt rejected a draft before its last step")


@pytest.mark.parametrize("extra", [-1, 1])
def test_the_debug_check_names_both_counts(extra, monkeypatch):
    import re

    model = mf.sharp_model("llama")
    with pytest.raises(RuntimeError, match=r"KV cache holds \d+ tokens, the loop counts \d+ cached") as info:
        _run_until_a_crop(model, extra, True, monkeypatch)
    held, counted = map(int, re.findall(r"\d+", str(info.value)))
    assert held == counted - extra


@pytest.mark.parametrize("extra", [-1, 1])
def test_logits_catch_an_off_by_one_cache_without_the_check(extra, monkeypatch):
    """With the check off, an off-by-one crop runs to the end, and the
    comparison of logits finds it."""
    model = mf.sharp_model("llama")
    ids, result = _run_until_a_crop(model, extra, False, monkeypatch)
    _, expected_logits = _plain(model, ids, 24)
    with pytest.raises(AssertionError, match="logits differ at generated position"):
        _assert_same_logits(result.logits, expected_logits, {})


def test_the_suite_runs_with_the_debug_check():
    from pld import loop

    # tests/conftest.py sets PLD_DEBUG_CACHE=1 unless the environment says otherwise
    assert loop.DEBUG_CHECKS == (os.environ.get("PLD_DEBUG_CACHE", "") not in ("", "0"))
