"""Sampling with prompt lookup: reproducible under a seed, top_k=1 is
greedy, and the output distribution is the model's.

The statistical test draws the first two tokens a few thousand times on a
tiny 8-token model whose prompt guarantees a two-token draft (chosen to be
likely, so that the accept, reject and bonus paths all occur) and compares
the joint histogram with p(t1) * p(t2 | t1), computed from the model's
logits, by a chi-square test (the p-value helper of test_accept.py).
"""
from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture
from test_accept import chi2_pvalue

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

ALPHA = 1e-4  # seeds are fixed: deterministic; the threshold is about power


def _sample_pld(model, ids, seed, **kw):
    import torch

    import pld

    torch.manual_seed(seed)
    return pld.generate(model, ids, do_sample=True, eos_token_id=None, **kw).new_tokens


def _sample_hf(model, ids, seed, **kw):
    import torch

    import pld

    torch.manual_seed(seed)
    with torch.no_grad(), pld.enabled():
        out = model.generate(ids, do_sample=True, **kw)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_seeded_runs_are_reproducible(arch, monkeypatch):
    model = mf.tiny_model(arch)
    counter = mf.install_counter(monkeypatch)
    rng = random.Random(f"repro-{arch}")
    outputs = []
    for seed in range(6):
        ids = mf.as_ids(mf.repeated_prompt(rng))
        a = _sample_pld(model, ids, seed, max_new_tokens=20, prompt_lookup_num_tokens=5, temperature=1.5)
        b = _sample_pld(model, ids, seed, max_new_tokens=20, prompt_lookup_num_tokens=5, temperature=1.5)
        assert a == b and len(a) == 20
        c = _sample_hf(model, ids, seed, max_new_tokens=20, prompt_lookup_num_tokens=5, top_p=0.9)
        d = _sample_hf(model, ids, seed, max_new_tokens=20, prompt_lookup_num_tokens=5, top_p=0.9)
        assert c == d and len(c) == 20
        outputs.append(a)
        # another seed, another draw (20 tokens at temperature 1.5 over ~80 ids)
        assert _sample_pld(model, ids, seed + 100, max_new_tokens=20, prompt_lookup_num_tokens=5,
                           temperature=1.5) != a
    assert counter.calls == 6 * 5
    assert len({tuple(o) for o in outputs}) == len(outputs)


@pytest.mark.parametrize("arch", mf.ALL_ARCHS)
def test_top_k_1_sampling_is_greedy(arch, monkeypatch):
    model = mf.tiny_model(arch)
    counter = mf.install_counter(monkeypatch)
    rng = random.Random(f"topk1-{arch}")
    for seed in range(8):
        ids = mf.as_ids(mf.repeated_prompt(rng))
        expected = mf.greedy(model, ids, 24)
        assert _sample_pld(model, ids, seed, max_new_tokens=24, prompt_lookup_num_tokens=6, top_k=1) == expected
        assert _sample_pld(model, ids, seed, max_new_tokens=24, prompt_lookup_num_tokens=6, top_k=1,
                           temperature=3.0) == expected
        assert _sample_hf(model, ids, seed, max_new_tokens=24, prompt_lookup_num_tokens=6,
                          top_k=1) == expected
    assert counter.calls == 8 * 3


# ------------------------------------------------------------ distribution
V = 8
TEMPERATURE = 2.0


def _stat_model():
    """A 1-layer Llama over 8 tokens whose next-token distributions are far
    from uniform (init range 0.3) yet spread at temperature 2."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=V - 1,
                         bos_token_id=None, eos_token_id=None, initializer_range=0.3)
    model = LlamaForCausalLM(config).eval().to(mf.DEVICE)
    model.generation_config.eos_token_id = None
    return model


def _next_probs(model, tokens):
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([tokens], device=model.device)).logits[0, -1].double()
    return torch.softmax(logits / TEMPERATURE, dim=-1).tolist()


def _prompt_with_likely_draft(model):
    """[a, b, x, y, c, a, b]: the tail (a, b) matches at the start, so the
    draft is [x, y]; x, y are chosen to be likely there."""
    a, b, c = 1, 2, 3
    best = None
    for x, y in itertools.product(range(V - 1), repeat=2):
        prompt = [a, b, x, y, c, a, b]
        p1 = _next_probs(model, prompt)[x]
        if p1 < 0.15:
            continue
        p2 = _next_probs(model, prompt + [x])[y]
        score = min(p1, p2)
        if best is None or score > best[0]:
            best = (score, prompt)
    assert best is not None and best[0] > 0.1
    return best[1]


def _pooled(counts, probs, n, min_expected=5.0):
    """Cells with expected count below min_expected pooled into one."""
    keep = [c for c, p in enumerate(probs) if n * p >= min_expected]
    rest = [c for c, p in enumerate(probs) if n * p < min_expected]
    index = {c: i for i, c in enumerate(keep)}
    pooled_probs = [probs[c] for c in keep]
    pooled_counts = Counter()
    for c, k in counts.items():
        pooled_counts[index.get(c, len(keep))] += k
    if rest:
        pooled_probs.append(sum(probs[c] for c in rest))
    return pooled_counts, pooled_probs


def joint_law(model, prompt):
    """(p(t1), p(t1) * p(t2 | t1) flattened as t1 * V + t2) after prompt."""
    p1 = _next_probs(model, prompt)
    joint = [p1[t1] * q for t1 in range(V) for q in _next_probs(model, prompt + [t1])]
    assert abs(sum(joint) - 1) < 1e-9
    return p1, joint


def check_joint_law(counts, p1, joint, n):
    """The first two tokens' histogram ``counts`` (key t1 * V + t2) fits
    the joint law, and the same draws reject a law that ignores t1 in
    p(t2 | t1) (power)."""
    pooled_counts, pooled_probs = _pooled(counts, joint, n)
    assert chi2_pvalue(pooled_counts, pooled_probs) > ALPHA
    p2_marginal = [sum(joint[t1 * V + t2] for t1 in range(V)) for t2 in range(V)]
    independent = [p1[t1] * p2_marginal[t2] for t1 in range(V) for t2 in range(V)]
    wrong_counts, wrong_probs = _pooled(counts, independent, n)
    assert chi2_pvalue(wrong_counts, wrong_probs) < ALPHA


def test_joint_distribution_of_first_two_tokens():
    import torch

    import pld

    model = _stat_model()
    prompt = _prompt_with_likely_draft(model)
    ids = torch.tensor([prompt], device=model.device)
    p1, joint = joint_law(model, prompt)

    N = 2000
    torch.manual_seed(2024)
    counts = Counter()
    first_steps = Counter()
    for _ in range(N):
        gen = pld.generate(model, ids, max_new_tokens=3, prompt_lookup_num_tokens=2, max_matching_ngram_size=2,
                           do_sample=True, temperature=TEMPERATURE, eos_token_id=None)
        t = gen.new_tokens
        counts[t[0] * V + t[1]] += 1
        first = gen.stats.records[0]
        assert first.proposed == 2
        first_steps[first.accepted] += 1
    # every path occurred: draft rejected at once, one accepted, both accepted
    assert all(first_steps[a] > 20 for a in (0, 1, 2)), first_steps

    check_joint_law(counts, p1, joint, N)


def test_first_token_distribution_through_model_generate():
    """The same law through model.generate(prompt_lookup_num_tokens=2,
    do_sample=True) with pld enabled (the native loop, transformers'
    temperature warper): the first token against p(t1)."""
    import torch

    import pld

    model = _stat_model()
    prompt = _prompt_with_likely_draft(model)
    ids = torch.tensor([prompt], device=model.device)
    p1 = _next_probs(model, prompt)
    N = 1500
    torch.manual_seed(77)
    counts = Counter()
    with torch.no_grad(), pld.enabled():
        for _ in range(N):
            out = model.generate(ids, do_sample=True, temperature=TEMPERATURE, max_new_tokens=2,
                                 prompt_lookup_num_tokens=2, max_matching_ngram_size=2, top_k=None,
                                 top_p=None)
            counts[int(out[0, len(prompt)])] += 1
    pooled_counts, pooled_probs = _pooled(counts, p1, N)
    assert chi2_pvalue(pooled_counts, pooled_probs) > ALPHA
