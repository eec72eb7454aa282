"""NgramIndex.propose_tree (C) == tests/reference.py's propose_tree_reference.

Small vocabularies (1..5) so that n-grams recur and tries branch; every
policy; the index built in chunks with truncations between them (the
chains of occurrences must survive both); depth, per_ngram, max_nodes and
eos drawn. Then the binding's argument checks.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pld
from reference import propose_tree_reference

EX = settings().max_examples


@st.composite
def tree_cases(draw):
    vocab = draw(st.integers(1, 5))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.one_of(st.integers(0, 30), st.integers(0, 300)))
    seq = [rng.randint(1, vocab) for _ in range(n)]
    max_n = draw(st.integers(1, 4))
    min_n = draw(st.integers(1, max_n))
    policy = draw(st.sampled_from(["first", "recent", "frequent"]))
    depth = draw(st.integers(1, 12))
    per_ngram = draw(st.integers(1, 6))
    max_nodes = draw(st.one_of(st.integers(0, 8), st.integers(0, 200)))
    eos = draw(st.lists(st.integers(1, 6), max_size=2))
    cuts = draw(st.lists(st.integers(0, 400), max_size=3))
    return seq, max_n, min_n, policy, depth, per_ngram, max_nodes, eos, cuts


@settings(max_examples=EX)
@given(case=tree_cases())
def test_propose_tree_matches_reference(case):
    seq, max_n, min_n, policy, depth, per_ngram, max_nodes, eos, cuts = case
    ix = pld.NgramIndex(max_n, min_n, policy)
    shadow: list = []
    # extend in chunks, truncating back (and re-extending) at the cut points
    pos = 0
    for cut in sorted(cuts) + [len(seq)]:
        cut = min(cut, len(seq))
        ix.extend(seq[pos:cut])
        shadow = seq[:cut]
        if cut >= 3:
            ix.truncate(cut - 2)
            ix.extend(seq[cut - 2:cut])
        pos = cut
        got = ix.propose_tree(depth, per_ngram=per_ngram, max_nodes=max_nodes,
                              eos_token_id=eos or None)
        want = propose_tree_reference(shadow, max_n, min_n, policy, depth, per_ngram,
                                      max_nodes, eos)
        assert tuple(got) == tuple(want), (shadow, got, want)


def test_propose_tree_small_hand_checked():
    # 1 2 3 | 4 ... 1 2 3 | 5 ... 1 2 3 | 4 6 ... 1 2 3
    seq = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 6, 1, 2, 3]
    ix = pld.NgramIndex(3, 1, "recent")
    ix.extend(seq)
    tokens, parents, depths, ngrams, supports = ix.propose_tree(2)
    # earliest (4 1), newest (4 6), then (5 1): 4 shared by two candidates
    assert tokens == [4, 1, 6, 5, 1]
    assert parents == [-1, 0, 0, -1, 3]
    assert depths == [1, 2, 2, 1, 2]
    assert supports == [2, 1, 1, 1, 1]
    assert ngrams == [3, 3, 3, 3, 3]
    first = pld.NgramIndex(3, 1, "first")
    first.extend(seq)
    assert first.propose_tree(2)[0] == [4, 1]  # the earliest occurrence only
    assert first.propose_tree(2, eos_token_id=1)[0] == [4]
    assert first.propose_tree(2, max_nodes=0)[0] == []
    assert pld.NgramIndex().propose_tree(3) == ([], [], [], [], [])


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(depth=0), ValueError, "depth"),
    (dict(depth="3"), TypeError, "depth"),
    (dict(depth=3, per_ngram=0), ValueError, "per_ngram"),
    (dict(depth=3, per_ngram=17), ValueError, "per_ngram"),
    (dict(depth=3, max_nodes=-1), ValueError, "max_nodes"),
    (dict(depth=3, max_nodes=5000), ValueError, "max_nodes"),
    (dict(depth=3, eos_token_id="x"), TypeError, "eos_token_id"),
    (dict(depth=True), TypeError, "depth"),
])
def test_propose_tree_bad_arguments(kwargs, exc, name):
    ix = pld.NgramIndex()
    ix.extend([1, 2, 1, 2])
    with pytest.raises(exc, match=name):
        ix.propose_tree(**kwargs)


def test_propose_tree_requires_depth():
    with pytest.raises(TypeError, match="depth"):
        pld.NgramIndex().propose_tree()
