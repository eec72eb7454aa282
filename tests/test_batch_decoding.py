"""Batched prompt lookup (pld.generate / pld.loop.run_batch with [B, L]):
every row equals greedy decoding of that row alone and the batch equals
batched greedy ``model.generate`` (float32; tiny Llama and GPT-2; B in
{2, 3, 8}; prompts of different lengths, left-padded; eos and budgets
reached at different steps; drafts verified in full and under the width
budget); sampling per row repeats under a seed, whatever was verified; stopping criteria and
logits processors per row.
"""
from __future__ import annotations

import random

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]


def _batch(prompts):
    import torch

    L = max(map(len, prompts))
    ids = torch.tensor([[mf.PAD] * (L - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.mark.parametrize("arch", mf.ARCHS)
@pytest.mark.parametrize("B", [2, 3, 8])
def test_batch_rows_equal_greedy_alone_and_batched_generate(arch, B):
    import torch

    import pld

    model = mf.tiny_model(arch)
    rng = random.Random(f"batch-{arch}-{B}")
    accepted = 0
    for trial in range(6):
        prompts = [mf.repeated_prompt(rng) for _ in range(B)]
        ids, mask = _batch(prompts)
        n_new = [1, 40, 2, 30, 40, 25][trial]
        alone = [mf.greedy(model, mf.as_ids(p), n_new) for p in prompts]
        # an eos that some rows reach early and others never
        eos = rng.choice(alone[0]) if trial % 2 and alone[0] else None
        if eos is not None:
            alone = [mf.greedy(model, mf.as_ids(p), n_new, eos=eos) for p in prompts]
        gen = pld.generate(model, ids, attention_mask=mask, max_new_tokens=n_new, eos_token_id=eos,
                           prompt_lookup_num_tokens=rng.choice([1, 3, 10]), cost_aware=trial >= 3)
        assert gen.new_tokens == alone, dict(trial=trial, n_new=n_new, eos=eos)
        with torch.no_grad():
            batched = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n_new,
                                     eos_token_id=eos, pad_token_id=mf.PAD)
        assert gen.sequences.tolist() == batched.tolist()
        accepted += gen.stats.accepted_draft_tokens
    assert accepted > 0  # drafts were verified and accepted, not only plain steps


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_batch_sampling_repeats_under_a_seed(arch):
    import torch

    import pld

    model = mf.tiny_model(arch)
    rng = random.Random(f"batch-sample-{arch}")
    ids, mask = _batch([mf.repeated_prompt(rng) for _ in range(3)])
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        runs.append(pld.generate(model, ids, attention_mask=mask, max_new_tokens=16, do_sample=True,
                                 temperature=1.5, eos_token_id=None).new_tokens)
    assert runs[0] == runs[1] and all(len(r) == 16 for r in runs[0])


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_a_seeded_batch_does_not_depend_on_what_was_verified(arch):
    """Each row samples from its own uniforms, seeded from torch's
    generator as the run begins: the same seed gives every row the same
    tokens whatever depth any row verified (k, the width budget), and
    leaves torch's generator one draw a row on, whatever was drawn."""
    import copy

    import torch

    import pld
    from pld.accept_walk import UniformStream

    model = copy.deepcopy(mf.tiny_model(arch))
    with torch.no_grad():  # logits 100 times as far apart: samples follow the model's greedy text
        (model.model.norm if arch == "llama" else model.transformer.ln_f).weight.mul_(100)
    rng = random.Random(f"batch-verified-{arch}")
    # prompts that end in the model's own greedy text, so drafts are accepted
    prompts = [p + mf.greedy(model, mf.as_ids(p), 30) for p in (mf.repeated_prompt(rng) for _ in range(3))]
    ids, mask = _batch([p[:len(p) - 3 * i] for i, p in enumerate(prompts)])
    torch.manual_seed(5)
    UniformStream.seeds(3)
    after = torch.random.get_rng_state()
    runs, accepted = [], []
    for options in (dict(prompt_lookup_num_tokens=10, cost_aware=False),
                    dict(prompt_lookup_num_tokens=1, cost_aware=False),
                    dict(prompt_lookup_num_tokens=3, cost_aware=False), dict(cost_aware=True)):
        torch.manual_seed(5)
        gen = pld.generate(model, ids, attention_mask=mask, max_new_tokens=24, do_sample=True,
                           temperature=1.0, eos_token_id=None, **options)
        assert torch.equal(torch.random.get_rng_state(), after), options
        runs.append(gen.new_tokens)
        accepted.append(gen.stats.accepted_draft_tokens)
    assert all(r == runs[0] for r in runs), accepted
    assert accepted[0] > accepted[1] > 0, accepted  # the runs verified different depths


def test_batch_top_k_1_sampling_is_greedy_per_row():
    import torch

    import pld

    model = mf.tiny_model("llama")
    rng = random.Random("batch-topk1")
    prompts = [mf.repeated_prompt(rng) for _ in range(3)]
    ids, mask = _batch(prompts)
    torch.manual_seed(0)
    got = pld.generate(model, ids, attention_mask=mask, max_new_tokens=12, do_sample=True, top_k=1,
                       eos_token_id=None, cost_aware=False).new_tokens
    assert got == [mf.greedy(model, mf.as_ids(p), 12) for p in prompts]


def test_batch_processors_and_stopping_criteria_per_row():
    import torch
    from transformers import (LogitsProcessorList, MaxLengthCriteria, RepetitionPenaltyLogitsProcessor,
                              StoppingCriteria, StoppingCriteriaList)

    import pld

    model = mf.tiny_model("llama")
    rng = random.Random("batch-proc")
    prompts = [mf.repeated_prompt(rng) for _ in range(3)]
    ids, mask = _batch(prompts)
    # a processor of the caller's sees each row as batched generate shows it
    # (left padding included); generate's own repetition_penalty skips the
    # padding (a per-row prompt_ignore_length set up for the whole batch)
    penalty = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5)])
    gen = pld.generate(model, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=None,
                       logits_processor=penalty, cost_aware=False)
    with torch.no_grad():
        batched = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                                 eos_token_id=None, pad_token_id=mf.PAD, logits_processor=penalty)
    assert gen.sequences.tolist() == batched.tolist()
    with pld.enabled(cost_aware=False):
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                                 eos_token_id=None, pad_token_id=mf.PAD, repetition_penalty=1.5,
                                 prompt_lookup_num_tokens=5)
    with torch.no_grad():  # (4.57 penalises the padding too; 5.x skips it)
        plain = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                               eos_token_id=None, pad_token_id=mf.PAD, repetition_penalty=1.5)
    assert out.tolist() == plain.tolist()
    # a criterion on each row's own tokens: rows stop at different steps
    # (criteria too see each row as batched generate shows it)
    first = mf.greedy(model, mf.as_ids(prompts[0]), 20)

    class StopAt(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == first[6]

    stop = StoppingCriteriaList([StopAt(), MaxLengthCriteria(max_length=ids.shape[1] + 20)])
    gen = pld.generate(model, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=None,
                       stopping_criteria=stop, cost_aware=False)
    for p, row in zip(prompts, gen.new_tokens):
        alone = mf.greedy(model, mf.as_ids(p), 20)
        assert row == (alone[:alone.index(first[6]) + 1] if first[6] in alone else alone)
    assert len({len(row) for row in gen.new_tokens}) > 1


def test_batch_of_one_row_equals_the_single_row_loop():
    import pld

    model = mf.tiny_model("gpt2")
    ids = mf.as_ids(mf.repeated_prompt(random.Random("one")))
    from pld import loop
    import torch

    with torch.no_grad():
        seqs, rows, _ = loop.run_batch(model, ids, max_new_tokens=16, cost_aware=False)
    assert rows[0] == mf.greedy(model, ids, 16)
    assert pld.generate(model, ids, max_new_tokens=16, eos_token_id=None).new_tokens == rows[0]


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_batch_through_model_generate(arch, monkeypatch):
    """pld.enable(): model.generate(batch, attention_mask=...,
    prompt_lookup_num_tokens=k) runs the batched loop (transformers itself
    refuses a batch there) and equals batched greedy."""
    import torch

    import pld
    from pld import loop

    model = mf.tiny_model(arch)
    calls = []
    original = loop.run
    monkeypatch.setattr(loop, "run", lambda model, ids, *a, **k: calls.append(ids.shape[0]) or original(model, ids, *a, **k))
    rng = random.Random(f"batch-hf-{arch}")
    for B in (2, 4):
        ids, mask = _batch([mf.repeated_prompt(rng) for _ in range(B)])
        with torch.no_grad():
            want = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
                                  pad_token_id=mf.PAD)
            with pld.enabled():
                got = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
                                     prompt_lookup_num_tokens=5, pad_token_id=mf.PAD)
                out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
                                     prompt_lookup_num_tokens=5, pad_token_id=mf.PAD,
                                     return_dict_in_generate=True)
        assert got.tolist() == want.tolist()
        assert out.sequences.tolist() == want.tolist()
    assert calls == [2, 2, 4, 4]


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_batch_exact_through_cache_compactions(arch, monkeypatch):
    """The cache compacted whenever that shortens it at all (from 8 slots)
    on context-sensitive models: a slot moved to the wrong row or place
    would change the tokens."""
    import torch

    from pld import loop, slot_table

    monkeypatch.setattr(slot_table, "COMPACT_MIN_SLOTS", 8)
    monkeypatch.setattr(slot_table, "COMPACT_SHARE", 0.01)
    model = mf.sharp_model(arch)
    rng = random.Random(f"batch-compact-{arch}")
    compactions = 0
    original = slot_table.SlotTable.gather

    def counting(self, index):
        nonlocal compactions
        compactions += 1
        return original(self, index)

    monkeypatch.setattr(slot_table.SlotTable, "gather", counting)
    for _ in range(3):
        prompts = [mf.repeated_prompt(rng) for _ in range(5)]
        ids, mask = _batch(prompts)
        with torch.no_grad():
            _, rows, _ = loop.run_batch(model, ids, attention_mask=mask, max_new_tokens=40,
                                        cost_aware=False)
        assert rows == [mf.greedy(model, mf.as_ids(p), 40) for p in prompts]
    assert compactions >= 3
