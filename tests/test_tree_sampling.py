"""Sampling through a token tree keeps the model's distribution.

A tiny 8-token model at temperature 2, a prompt whose suffix (a, b) occurs
twice before with different continuations (x y ... and x' y' ...), so the
first step verifies a tree with two branches from the root. Over a few
thousand seeded runs the first two tokens' joint histogram is compared
with p(t1) * p(t2 | t1) from the model's logits by a chi-square test, with
every way through the tree seen (no branch accepted, the first, the
second), and the same draws reject a wrong law (power).
"""
from __future__ import annotations

import itertools
from collections import Counter

import pytest

from models_fixtures import one_thread  # noqa: F401 - a fixture
from test_hf_sampling import TEMPERATURE, V, _next_probs, _stat_model, check_joint_law, joint_law

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]


def _branching_prompt(model):
    """[a, b, x, y, c, a, b, x', y', d, a, b] with x, x' the pair most
    likely after it (both, so both branches get accepted often)."""
    a, b, c, d, y, y2 = 1, 2, 3, 4, 5, 6
    best = None
    for x, x2 in itertools.permutations(range(V - 1), 2):
        prompt = [a, b, x, y, c, a, b, x2, y2, d, a, b]
        p = _next_probs(model, prompt)
        score = min(p[x], p[x2])
        if best is None or score > best[0]:
            best = (score, prompt, x, x2)
    assert best[0] > 0.1
    return best[1], best[2], best[3]


def test_joint_distribution_of_first_two_tokens_through_a_tree():
    import torch

    import pld

    model = _stat_model()
    prompt, x, x2 = _branching_prompt(model)
    ids = torch.tensor([prompt], device=model.device)
    p1, joint = joint_law(model, prompt)

    N = 2500
    torch.manual_seed(2025)
    counts = Counter()
    ways = Counter()
    for _ in range(N):
        gen = pld.generate(model, ids, max_new_tokens=3, prompt_lookup_num_tokens=2, max_matching_ngram_size=2,
                           do_sample=True, temperature=TEMPERATURE, eos_token_id=None,
                           draft_tree=True, record_steps=True)
        t = gen.new_tokens
        counts[t[0] * V + t[1]] += 1
        first = gen.stats.records[0]
        assert first.proposed >= 3  # both branches verified in the first step
        ways["none" if first.accepted == 0 else ("x" if t[0] == x else "x2")] += 1
    assert ways["none"] > 50 and ways["x"] > 50 and ways["x2"] > 50, ways

    check_joint_law(counts, p1, joint, N)
