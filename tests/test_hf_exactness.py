"""Greedy exactness of pld's transformers integration (float32).

On tiny random Llama and GPT-2 models built from configs, for 120 seeded
prompts with repeated spans: plain ``model.generate(do_sample=False)``
against (a) ``model.generate(prompt_lookup_num_tokens=k)`` with pld enabled
(served by the native loop: no fallback), (b) ``pld.generate``, with various
draft lengths, n-gram sizes, eos ids and token budgets (including 1 and 2).
Also: eos inside what would be an accepted draft, an explicit attention
mask (all ones, and left padding), and the adaptive draft length of
``pld.loop.run``.
"""
from __future__ import annotations

import logging
import random

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

PROMPTS_PER_BATCH = 10
BATCHES = 6  # 6 batches x 10 prompts x 3 models = 180 prompts
OTHER_EOS = mf.PROMPT_VOCAB  # an id no prompt uses (and not the pad)


def _no_pld_warnings(caplog):
    records = [r for r in caplog.records if r.name == "pld" and r.levelno >= logging.WARNING]
    assert not records, [r.getMessage() for r in records]


def _case(rng, generated):
    """Draw (k, ngram, eos) for a prompt; eos from the greedy output when
    there is one, so that it matters."""
    k = rng.choice([1, 2, 3, 5, 8, 10])
    ngram = rng.choice([1, 2, 3, 4])
    roll = rng.random()
    if roll < 0.35 or not generated:
        eos = None
    elif roll < 0.75:
        eos = rng.choice(generated)
    else:
        eos = [rng.choice(generated), rng.randrange(mf.PROMPT_VOCAB)]
    return k, ngram, eos


@pytest.mark.parametrize("arch", mf.ALL_ARCHS)
@pytest.mark.parametrize("batch", range(BATCHES))
def test_greedy_exact_on_repeated_prompts(arch, batch, monkeypatch, caplog):
    import pld

    caplog.set_level(logging.WARNING, logger="pld")
    model = mf.tiny_model(arch)
    counter = mf.install_counter(monkeypatch)
    rng = random.Random(f"exact-{arch}-{batch}")
    for i in range(PROMPTS_PER_BATCH):
        prompt = mf.repeated_prompt(rng)
        ids = mf.as_ids(prompt)
        n_new = [1, 2, rng.randint(3, 12), rng.randint(13, 32)][i % 4]
        free = mf.greedy(model, ids, n_new)
        k, ngram, eos = _case(rng, free)
        expected = mf.greedy(model, ids, n_new, eos=eos) if eos is not None else free
        where = dict(prompt=prompt, n_new=n_new, k=k, ngram=ngram, eos=eos)

        got_hf = mf.hf_pld(model, ids, n_new, k, eos=eos, ngram=ngram)
        assert got_hf == expected, where
        assert len(got_hf) <= n_new

        k2, ngram2 = rng.choice([1, 3, 4, 10]), rng.choice([1, 2, 3])
        gen = pld.generate(model, ids, max_new_tokens=n_new, prompt_lookup_num_tokens=k2,
                           max_matching_ngram_size=ngram2, eos_token_id=eos)
        assert gen.new_tokens == expected, dict(where, k2=k2, ngram2=ngram2)
        assert gen.sequences[0, :len(prompt)].tolist() == prompt
    # every enabled call was served by the native loop, none fell back
    assert counter.calls == 2 * PROMPTS_PER_BATCH  # model.generate + pld.generate
    _no_pld_warnings(caplog)


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_drafts_are_accepted(arch, monkeypatch):
    """The tiny models do accept drafts (else the tests above exercise
    nothing but one-token steps), and those runs are exact too."""
    import pld

    model = mf.tiny_model(arch)
    counter = mf.install_counter(monkeypatch)
    rng = random.Random(f"accepted-{arch}")
    multi = 0
    for _ in range(12):
        ids = mf.as_ids(mf.repeated_prompt(rng))
        expected = mf.greedy(model, ids, 24)
        assert mf.hf_pld(model, ids, 24, 5, cost_aware=False) == expected
        gen = pld.generate(model, ids, max_new_tokens=24, prompt_lookup_num_tokens=5, eos_token_id=None,
                           cost_aware=False)
        assert gen.new_tokens == expected
        multi += any(r.accepted >= 2 for r in gen.stats.records)
    hf_stats = counter.results[0::2]
    assert sum(r.stats.accepted_draft_tokens for r in hf_stats) > 0
    assert multi >= 3


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_max_new_tokens_one_and_two(arch):
    import pld

    model = mf.tiny_model(arch)
    rng = random.Random(f"short-{arch}")
    for _ in range(8):
        prompt = mf.repeated_prompt(rng, max_len=30)
        ids = mf.as_ids(prompt)
        for n_new in (1, 2):
            expected = mf.greedy(model, ids, n_new)
            assert len(expected) == n_new
            for k in (1, 4, 10):
                assert mf.hf_pld(model, ids, n_new, k) == expected
                assert pld.generate(model, ids, max_new_tokens=n_new, prompt_lookup_num_tokens=k,
                                    eos_token_id=None).new_tokens == expected


def _eos_candidate(records, generated):
    """A token that a step accepted from its draft, not as the step's first
    token, and that does not occur earlier in the output; or None."""
    offset = 0
    for r in records:
        for j in range(1, r.accepted):
            if r.tokens[j] not in generated[:offset + j]:
                return r.tokens[j]
        offset += len(r.tokens)
    return None


@pytest.mark.parametrize("arch", ["llama", "gpt2-untied"])
def test_eos_inside_an_accepted_draft(arch):
    """Make eos a token that pld accepted from a draft (run without eos), not
    as the first token of its step, and new to the output: with it as eos,
    the output must end exactly at it, as greedy's does.

    Such tokens are common once the prompt holds the model's own greedy
    continuation (random models fall into cycles): the prompt is a random
    prefix plus the first ``h`` tokens of its greedy continuation.
    """
    import pld

    rng = random.Random(f"eos-{arch}")
    found = 0
    for attempt in range(160):
        model = mf.tiny_model(arch, seed=attempt // 40)  # a few models
        prefix = mf.repeated_prompt(rng, min_len=6, max_len=30)
        h = rng.randint(8, 24)
        prompt = prefix + mf.greedy(model, mf.as_ids(prefix), h)
        ids = mf.as_ids(prompt)
        n_new = 32
        run = pld.generate(model, ids, max_new_tokens=n_new, prompt_lookup_num_tokens=8, eos_token_id=None,
                           cost_aware=False)  # every draft verified: the search needs them
        eos = _eos_candidate(run.stats.records, run.new_tokens)
        if eos is None:
            continue
        expected = mf.greedy(model, ids, n_new, eos=eos)
        assert expected[-1] == eos and eos not in expected[:-1]
        assert expected == run.new_tokens[:run.new_tokens.index(eos) + 1]
        expected_two = mf.greedy(model, ids, n_new, eos=[OTHER_EOS, eos])
        for k in (2, 8):
            assert mf.hf_pld(model, ids, n_new, k, eos=eos) == expected
            assert mf.hf_pld(model, ids, n_new, k, eos=[OTHER_EOS, eos]) == expected_two
            got = pld.generate(model, ids, max_new_tokens=n_new, prompt_lookup_num_tokens=k, eos_token_id=eos)
            assert got.new_tokens == expected
        found += 1
        if found == 10:
            break
    assert found >= 3, f"only {found} prompts had a suitable eos"


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_default_eos_from_generation_config(arch):
    """pld.generate's eos defaults to the model's generation config."""
    import pld

    model = mf.tiny_model(arch, seed=7)
    rng = random.Random(f"default-eos-{arch}")
    checked = 0
    for _ in range(10):
        ids = mf.as_ids(mf.repeated_prompt(rng))
        free = mf.greedy(model, ids, 16)
        eos = free[len(free) // 2]
        expected = mf.greedy(model, ids, 16, eos=eos)
        model.generation_config.eos_token_id = eos
        try:
            assert pld.generate(model, ids, max_new_tokens=16).new_tokens == expected
            # and None disables it
            assert pld.generate(model, ids, max_new_tokens=16, eos_token_id=None).new_tokens == free
        finally:
            model.generation_config.eos_token_id = None
        checked += 1
    assert checked == 10


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_explicit_attention_mask(arch, monkeypatch):
    import torch

    import pld

    model = mf.tiny_model(arch)
    counter = mf.install_counter(monkeypatch)
    rng = random.Random(f"mask-{arch}")
    for _ in range(8):
        ids = mf.as_ids(mf.repeated_prompt(rng))
        mask = torch.ones_like(ids)
        expected = mf.greedy(model, ids, 20, attention_mask=mask)
        assert expected == mf.greedy(model, ids, 20)
        assert mf.hf_pld(model, ids, 20, 5, attention_mask=mask) == expected
        assert pld.generate(model, ids, max_new_tokens=20, prompt_lookup_num_tokens=5,
                            attention_mask=mask).new_tokens == expected
    assert counter.calls == 2 * 8  # model.generate + pld.generate


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_left_padded_attention_mask(arch, monkeypatch):
    """A batch-of-one prompt with left padding: positions follow the mask."""
    import torch

    import pld

    model = mf.tiny_model(arch)
    counter = mf.install_counter(monkeypatch)
    rng = random.Random(f"leftpad-{arch}")
    for _ in range(6):
        prompt = mf.repeated_prompt(rng, max_len=40)
        n_pad = rng.randint(1, 5)
        ids = mf.as_ids([mf.PAD] * n_pad + prompt)
        mask = torch.tensor([[0] * n_pad + [1] * len(prompt)])
        expected = mf.greedy(model, ids, 20, attention_mask=mask)
        assert mf.hf_pld(model, ids, 20, 5, attention_mask=mask) == expected
        assert pld.generate(model, ids, max_new_tokens=20, prompt_lookup_num_tokens=5,
                            attention_mask=mask).new_tokens == expected
    assert counter.calls == 2 * 6  # model.generate + pld.generate


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_pad_tokens_without_a_mask_are_masked_as_generate_does(arch):
    """pld.generate without an attention_mask attends what generate() does:
    the pad id masked where the generation config names one that is not an
    eos id (left padding, padding inside one row, a left-padded batch), and
    every token where the pad id is an eos id."""
    import torch

    import pld

    model = mf.tiny_model(arch)
    rng = random.Random(f"inferred-mask-{arch}")
    for _ in range(3):
        prompt = mf.repeated_prompt(rng, max_len=30)
        cut = rng.randint(1, len(prompt) - 1)
        for tokens in ([mf.PAD] * rng.randint(1, 4) + prompt, prompt[:cut] + [mf.PAD] * 2 + prompt[cut:]):
            ids = mf.as_ids(tokens)
            assert pld.generate(model, ids, max_new_tokens=16, eos_token_id=None).new_tokens == \
                mf.greedy(model, ids, 16)
            # the pad id as eos: generate() infers no mask (the run stops at it, so compare one token)
            assert pld.generate(model, ids, max_new_tokens=1, eos_token_id=mf.PAD).new_tokens == \
                mf.greedy(model, ids, 1, eos=mf.PAD)
    other = mf.repeated_prompt(rng, min_len=12, max_len=12)
    batch = torch.tensor([other, [mf.PAD] * 4 + other[4:]])
    got = pld.generate(model, batch, max_new_tokens=12, eos_token_id=None).new_tokens
    assert got == [mf.greedy(model, batch[r:r + 1], 12) for r in range(2)]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_prompt_that_attends_nothing(arch):
    """A row whose mask attends no prompt token has no defined output (the
    tiny GPT-2 and pld's loop disagree on it): pld.generate refuses it
    naming the mask; under enable() generate() serves it as without pld."""
    import torch

    import pld

    model = mf.tiny_model(arch)
    ids = mf.as_ids([5, 6, 7, 5, 6])
    with pytest.raises(ValueError, match="attention_mask: rows \\[0\\] attend no token"):
        pld.generate(model, ids, attention_mask=torch.zeros_like(ids), max_new_tokens=4)
    with pytest.raises(ValueError, match="input_ids: the prompt holds the model's pad id"):
        pld.generate(model, mf.as_ids([mf.PAD] * 3), max_new_tokens=4)
    mask = torch.zeros_like(ids)
    assert mf.hf_pld(model, ids, 8, 3, attention_mask=mask) == mf.greedy(model, ids, 8, attention_mask=mask)


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_adaptive_draft_length_same_tokens(arch):
    import torch
    from transformers import DynamicCache

    from pld import loop

    model = mf.tiny_model(arch)
    rng = random.Random(f"adaptive-{arch}")
    proposed = {False: 0, True: 0}
    for _ in range(12):
        ids = mf.as_ids(mf.repeated_prompt(rng))
        n_new = rng.randint(1, 32)
        expected = mf.greedy(model, ids, n_new)
        for adaptive in (False, True):
            with torch.no_grad():
                result = loop.run(model, ids, cache=DynamicCache(), max_new_tokens=n_new,
                                  prompt_lookup_num_tokens=8, adaptive=adaptive, cost_aware=False)
            assert result.sequences[0, ids.shape[1]:].tolist() == expected, adaptive
            assert result.stats.new_tokens == len(expected)
            proposed[adaptive] += result.stats.proposed_tokens
    # adaptive proposes shorter drafts after rejections
    assert proposed[True] < proposed[False]


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_every_loop_variant_same_tokens(arch):
    """The draft rule changes the cost of a step, never its tokens: the
    match policies, transformers' clipped continuations, a minimum n-gram
    of 2, the cost gate and torch's own linear kernel (instead of oneDNN)
    in verification forwards all give greedy's output."""
    import torch
    from transformers import DynamicCache

    import pld
    from pld import loop

    model = mf.tiny_model(arch)
    rng = random.Random(f"variants-{arch}")
    variants = [dict(policy=p) for p in pld.POLICIES] + [dict(semantics="transformers"),
                                                         dict(min_ngram_size=2, max_matching_ngram_size=3),
                                                         dict(cost_aware=True),
                                                         dict(linear_kernel="torch")]
    accepted = {i: 0 for i in range(len(variants))}
    for _ in range(8):
        ids = mf.as_ids(mf.repeated_prompt(rng))
        n_new = rng.randint(1, 32)
        expected = mf.greedy(model, ids, n_new)
        for i, options in enumerate(variants):
            with torch.no_grad():
                result = loop.run(model, ids, cache=DynamicCache(), max_new_tokens=n_new,
                                  prompt_lookup_num_tokens=6, **{"cost_aware": False, **options})
            assert result.sequences[0, ids.shape[1]:].tolist() == expected, options
            accepted[i] += result.stats.accepted_draft_tokens
    # every variant's drafts were used (the budget's choices depend on timings)
    assert all(v for i, v in accepted.items() if not variants[i].get("cost_aware")), accepted


def test_loop_rejects_unknown_semantics():
    import torch
    from transformers import DynamicCache

    from pld import loop

    with pytest.raises(ValueError, match="semantics"):
        loop.run(mf.tiny_model("llama"), torch.tensor([[1, 2, 3]]), cache=DynamicCache(),
                 max_new_tokens=2, semantics="fuzzy")


@pytest.mark.parametrize("allow", [False, True])
def test_the_loop_obeys_the_width_budget(monkeypatch, allow):
    """A forward cost no draft can pay for leaves one forward per token after
    the prefill; a flat one verifies every draft in full; the tokens are
    greedy's either way, and the cost is measured once per run at most."""
    import torch
    from transformers import DynamicCache

    from pld import loop
    from pld.decoder import Decoder
    from pld.forward_cost import ForwardCost

    calls = []

    def fixed_cost(self):
        calls.append(self.pending)
        return ForwardCost([1, 2], [1.0, 1.0]) if allow else ForwardCost([1, 2], [1.0, 1000.0])

    monkeypatch.setattr(Decoder, "calibrate", fixed_cost)
    model = mf.tiny_model("llama")
    rng = random.Random("gate")
    proposed = 0
    for _ in range(6):
        ids = mf.as_ids(mf.repeated_prompt(rng))
        expected = mf.greedy(model, ids, 24)
        calls.clear()
        steps = []
        with torch.no_grad():
            result = loop.run(model, ids, cache=DynamicCache(), max_new_tokens=24, eos_token_id=None,
                              prompt_lookup_num_tokens=6, cost_aware=True, on_step=steps.append)
        assert result.sequences[0, ids.shape[1]:].tolist() == expected
        assert len(calls) <= 1 and calls in ([], [1])  # after the prefill, one pending token
        later = sum(r.proposed for r in steps[1:])
        proposed += later
        if not allow:
            assert later == 0 and all(len(r.tokens) == 1 for r in steps[1:])
    assert (proposed > 0) == allow
