"""Acceptance of a verified token tree in C: pld.accept_greedy and
pld.accept_sample (csrc/pld.h's walk).

Checked four ways: (a) hand-worked trees, chains and the root alone;
(b) hypothesis properties that C equals the plain-Python reference
(tests/reference.py) on random trees -- small vocabularies, duplicate tokens
among siblings, chains, empty trees -- with f32/f16/bf16 probabilities;
(c) chi-square tests that sampling keeps the model's law of the first two
tokens, through a chain and through a tree; (d) edge cases of the inputs.
The chi-square helpers (chi2_sf, chi2_pvalue, ALPHA) serve other tests too.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pld
from reference import accept_greedy_tree, accept_sample_tree, inverse_cdf, tree_depth

EX = settings().max_examples


def _torch():
    import torch

    return torch


# ================================================================ strategies
@st.composite
def trees(draw, max_nodes=10):
    """(tokens, parents, vocab): parents in [-1, i), a chain a third of the
    time; tokens from a vocabulary of 2-8, so siblings often share one."""
    vocab = draw(st.integers(2, 8))
    n = draw(st.integers(0, max_nodes))
    if draw(st.integers(0, 2)) == 0:
        parents = list(range(-1, n - 1))
    else:
        parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    return tokens, parents, vocab


def _check_walk(tokens, parents, path, accepted):
    """The walk's invariants: path is a parent chain from the root, each
    node the first child of its parent with its token, accepted = the
    path's tokens and one more, which no child of the last node holds."""
    assert len(accepted) == len(path) + 1
    node = -1
    for j, c in enumerate(path):
        assert parents[c] == node and tokens[c] == accepted[j]
        assert not any(parents[e] == node and tokens[e] == accepted[j] for e in range(node + 1, c))
        node = c
    assert not any(parents[e] == node and tokens[e] == accepted[-1] for e in range(node + 1, len(tokens)))


# ==================================================================== greedy
def test_greedy_hand_checked_tree():
    #        root
    #      /   |   \
    #   0:5   1:6   4:5  (a later duplicate of node 0: never reached)
    #    |     |     |
    #   2:7   3:8   5:7
    tokens, parents = [5, 6, 7, 8, 5, 7], [-1, -1, 0, 1, -1, 4]
    #                root 0  1  2  3  4  5
    assert pld.accept_greedy(tokens, [5, 7, 0, 9, 0, 0, 0], parents) == ([0, 2], [5, 7, 9])
    assert pld.accept_greedy(tokens, [6, 0, 8, 0, 1, 0, 0], parents) == ([1, 3], [6, 8, 1])
    assert pld.accept_greedy(tokens, [6, 0, 3, 0, 0, 0, 0], parents) == ([1], [6, 3])
    assert pld.accept_greedy(tokens, [4, 7, 7, 7, 7, 7, 7], parents) == ([], [4])


def test_greedy_first_matching_child_wins():
    # two children of the root with token 3: the walk takes the first (node
    # 0), whose child disagrees; the second (node 1) would have gone on
    tokens, parents = [3, 3, 4], [-1, -1, 1]
    assert pld.accept_greedy(tokens, [3, 9, 4, 1], parents) == ([0], [3, 9])
    assert pld.accept_greedy(tokens, [3, 9, 4, 1], parents) == accept_greedy_tree(tokens, [3, 9, 4, 1], parents)


def test_greedy_chains_and_the_root_alone():
    assert pld.accept_greedy([1, 2, 3], [1, 2, 9, 4]) == ([0, 1], [1, 2, 9])
    assert pld.accept_greedy([1, 2, 3], [1, 2, 3, 4]) == ([0, 1, 2], [1, 2, 3, 4])
    assert pld.accept_greedy([5, 2, 3], [1, 2, 3, 4]) == ([], [1])
    assert pld.accept_greedy([1, 2, 3], [1, 2, 3, 4], [-1, 0, 1]) == ([0, 1, 2], [1, 2, 3, 4])
    assert pld.accept_greedy([], [7]) == ([], [7])
    assert pld.accept_greedy([], [7], []) == ([], [7])
    assert pld.accept_greedy([], [7, 8, 9]) == ([], [7])  # extra choices are ignored
    lo, hi = -(2**63), 2**63 - 1
    assert pld.accept_greedy([lo, hi], [lo, hi, -1]) == ([0, 1], [lo, hi, -1])
    assert pld.accept_greedy([lo, hi], [lo, lo, -1]) == ([0], [lo, lo])


@pytest.mark.parametrize("form", ["list", "tuple", "np64", "np32", "nested-list"])
def test_greedy_input_forms(form):
    conv = {"list": list, "tuple": tuple,
            "np64": lambda x: np.array(x, dtype=np.int64),
            "np32": lambda x: np.array(x, dtype=np.int32),
            "nested-list": lambda x: [list(x)]}[form]
    tokens, parents, choices = [5, 6, 7], [-1, -1, 1], [6, 0, 7, 2]
    assert pld.accept_greedy(conv(tokens), conv(choices), conv(parents)) == ([1, 2], [6, 7, 2])


def test_greedy_refuses_2d_and_strided_buffers():
    # (a [1, L] array was once read as its row, a strided one copied)
    tokens, parents, choices = [5, 6, 7], [-1, -1, 1], [6, 0, 7, 2]
    for arg, bad in (("tokens", np.array([tokens])), ("choices", np.repeat(choices, 2)[::2]),
                     ("parents", np.array([parents]))):
        args = {"tokens": tokens, "choices": choices, "parents": parents, arg: bad}
        with pytest.raises(ValueError, match=arg):
            pld.accept_greedy(**args)


@pytest.mark.torch
def test_greedy_torch_inputs():
    torch = _torch()
    for dt in (torch.int32, torch.int64):
        t = torch.tensor([5, 6, 7], dtype=dt)
        c = torch.tensor([6, 0, 7, 2], dtype=dt)
        p = torch.tensor([-1, -1, 1], dtype=dt)
        assert pld.accept_greedy(t, c, p) == ([1, 2], [6, 7, 2])
        big = torch.zeros(8, dtype=dt)
        big[::2] = c
        assert pld.accept_greedy(t, big[::2], p) == ([1, 2], [6, 7, 2])  # strided


@settings(max_examples=EX)
@given(tree=trees(), data=st.data())
def test_greedy_equals_reference(tree, data):
    tokens, parents, vocab = tree
    n = len(tokens)
    choices = data.draw(st.lists(st.integers(0, vocab - 1), min_size=n + 1, max_size=n + 1))
    # often follow the tree, so that walks go deep
    if n and data.draw(st.booleans()):
        node = -1
        for c in range(n):
            if parents[c] == node:
                choices[node + 1] = tokens[c]
                node = c
    want = accept_greedy_tree(tokens, choices, parents)
    got = pld.accept_greedy(tokens, choices, parents)
    assert got == want
    _check_walk(tokens, parents, *got)
    for j, tok in enumerate(got[1]):  # each token is the choice at its position
        assert tok == choices[0 if j == 0 else got[0][j - 1] + 1]
    if parents == list(range(-1, n - 1)):
        assert pld.accept_greedy(tokens, choices) == got


# ================================================================== sampling
def test_sample_hand_checked_tree():
    # root -> 0:1 -> 2:0 ; root -> 1:2
    tokens, parents = [1, 2, 0], [-1, -1, 0]
    P = np.array([[1, 2, 1],   # root: 0 below u=.25, 1 below .75, then 2
                  [3, 0, 1],   # node 0: 0 below u=.75
                  [0, 0, 5],   # node 1: always 2
                  [0, 1, 1]], dtype=np.float32)
    assert pld.accept_sample(tokens, P, [0.5, 0.7, 0.9], parents) == ([0, 2], [1, 0, 2])
    assert pld.accept_sample(tokens, P, [0.8, 0.7, 0.0], parents) == ([1], [2, 2])
    assert pld.accept_sample(tokens, P, [0.1, 0.0, 0.0], parents) == ([], [0])
    assert pld.accept_sample(tokens, P, [0.5, 0.76, 0.0], parents) == ([0], [1, 2])
    assert pld.accept_sample(tokens, P * 8, [0.5, 0.7, 0.9], parents) == ([0, 2], [1, 0, 2])  # unnormalised
    assert pld.accept_sample(tokens, P[None], [0.5, 0.7, 0.9], parents) == ([0, 2], [1, 0, 2])  # [1, n+1, V]


def test_sample_uniforms_are_indexed_by_depth():
    # root -> 0:0, 1:1 ; 1 -> 2:1. The path root -> node 1 -> node 2 reads
    # positions 0, 2, 3 at depths 0, 1, 2: the uniforms used are u[0], u[1],
    # u[2] (a position-indexed scheme would read u[2] at node 1's row)
    tokens, parents = [0, 1, 1], [-1, -1, 1]
    P = np.array([[1, 1], [1, 1], [1, 1], [1, 1]], dtype=np.float32)
    u = [0.75, 0.75, 0.25]  # 0.75 -> token 1, 0.25 -> token 0
    assert pld.accept_sample(tokens, P, u, parents) == ([1, 2], [1, 1, 0])
    assert accept_sample_tree(tokens, P.tolist(), u, parents) == ([1, 2], [1, 1, 0])
    assert pld.accept_sample(tokens, P, [0.75, 0.25, 0.75], parents) == ([1], [1, 0])


def test_sample_chain_root_alone_and_ids_outside_the_vocabulary():
    P = np.array([[0.5, 0.25, 0.25, 0.0],
                  [0.0, 0.0, 1.0, 0.0],
                  [0.25, 0.25, 0.25, 0.25]], dtype=np.float32)
    assert pld.accept_sample([0, 2], P, [0.4, 0.0, 0.6]) == ([0, 1], [0, 2, 2])
    assert pld.accept_sample([0, 2], P, [0.6, 0.0, 0.6]) == ([], [1])
    assert pld.accept_sample([], P, [0.55]) == ([], [1])
    assert pld.accept_sample([], P[:1], [0.55, 0.99, 0.2]) == ([], [1])  # extra uniforms ignored
    assert pld.accept_sample([99, -1], P, [0.99, 0.99, 0.5], [-1, -1]) == ([], [2])  # never drawn
    assert pld.accept_sample([3], P, [0.99, 0.0]) == ([], [2])  # p = 0: never drawn


def test_sample_reads_only_the_rows_it_visits():
    P = np.array([[1, 0], [np.nan, 1], [1, 1]], dtype=np.float32)
    assert pld.accept_sample([1, 0], P, [0.5, 0.5], [-1, -1]) == ([1], [0, 1])  # row 1 never read
    with pytest.raises(ValueError, match="probs"):
        pld.accept_sample([0, 1], P, [0.5, 0.5], [-1, -1])  # 0 -> node 0, whose row has a NaN


def test_sample_big_vocabulary_without_the_gil():
    V = 1 << 16  # past the binding's threshold for releasing the GIL
    P = np.zeros((3, V), dtype=np.float32)
    P[0, V - 1] = P[1, 7] = P[2, 3] = 1.0
    assert pld.accept_sample([V - 1, 7], P, [0.3, 0.6, 0.9]) == ([0, 1], [V - 1, 7, 3])


@st.composite
def sample_cases(draw):
    tokens, parents, vocab = draw(trees(max_nodes=8))
    n = len(tokens)
    # dyadic probabilities (multiples of 1/32): exact in float16, bfloat16
    # and float32, so every element type sees the same numbers
    rows = []
    for _ in range(n + 1 + draw(st.integers(0, 1))):
        r = draw(st.lists(st.integers(0, 8), min_size=vocab, max_size=vocab))
        if sum(r) == 0:
            r[draw(st.integers(0, vocab - 1))] = 1
        rows.append([x / 32 for x in r])
    k = 1 + tree_depth(parents) + draw(st.integers(0, 1))
    u = draw(st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=k, max_size=k))
    return tokens, parents, rows, u


@settings(max_examples=EX)
@given(case=sample_cases(), dtype=st.sampled_from([np.float32, np.float16]))
def test_sample_equals_reference(case, dtype):
    tokens, parents, rows, u = case
    want = accept_sample_tree(tokens, rows, u, parents)
    got = pld.accept_sample(tokens, np.array(rows, dtype=dtype), u, parents)
    assert got == want
    _check_walk(tokens, parents, *got)
    path, accepted = got
    for j, tok in enumerate(accepted):  # a draw from its row with the uniform of its depth
        row = rows[0 if j == 0 else path[j - 1] + 1]
        assert row[tok] > 0 and tok == inverse_cdf(row, u[j])
    assert pld.accept_sample(tokens, np.array(rows, dtype=dtype), np.array(u), parents) == want


@pytest.mark.torch
@settings(max_examples=EX // 2)
@given(case=sample_cases(), dtype=st.sampled_from(["float32", "float16", "bfloat16"]))
def test_sample_equals_reference_torch(case, dtype):
    torch = _torch()
    tokens, parents, rows, u = case
    t = torch.tensor(rows, dtype=getattr(torch, dtype))
    want = accept_sample_tree(tokens, rows, u, parents)
    assert pld.accept_sample(tokens, t, u, parents) == want
    assert pld.accept_sample(torch.tensor(tokens, dtype=torch.int64), t,
                             torch.tensor(u, dtype=torch.float64),
                             torch.tensor(parents, dtype=torch.int64)) == want


@settings(max_examples=EX)
@given(case=sample_cases(), bad=st.sampled_from([np.nan, np.inf, -1.0]), where=st.data())
def test_sample_bad_rows_fail_only_where_visited(case, bad, where):
    tokens, parents, rows, u = case
    r = where.draw(st.integers(0, len(rows) - 1))
    rows = [list(x) for x in rows]
    rows[r][where.draw(st.integers(0, len(rows[r]) - 1))] = bad
    try:
        want = accept_sample_tree(tokens, rows, u, parents)
    except ValueError:
        with pytest.raises(ValueError, match="probs"):
            pld.accept_sample(tokens, np.array(rows, dtype=np.float32), u, parents)
    else:
        assert pld.accept_sample(tokens, np.array(rows, dtype=np.float32), u, parents) == want


# ------------------------------------------------------------ chi-square
def chi2_sf(x, dof):
    """P(X >= x) for X ~ chi-square(dof), integer dof, no scipy."""
    if x <= 0:
        return 1.0
    h = x / 2.0
    if dof % 2 == 0:
        term, total = 1.0, 1.0
        for i in range(1, dof // 2):
            term *= h / i
            total += term
        return math.exp(-h) * total
    total = math.erfc(math.sqrt(h))
    term = math.sqrt(h) / math.gamma(1.5)  # h^(1/2) / Gamma(3/2)
    for i in range(1, (dof - 1) // 2 + 1):
        if i > 1:
            term *= h / (i + 0.5 - 1)
        total += math.exp(-h) * term
    return total


def test_chi2_sf_known_values():
    # 95% critical values of the chi-square distribution
    for dof, crit in [(1, 3.841459), (2, 5.991465), (3, 7.814728), (4, 9.487729),
                      (5, 11.070498), (7, 14.067140)]:
        assert chi2_sf(crit, dof) == pytest.approx(0.05, rel=1e-5)
    assert chi2_sf(0.0, 3) == 1.0


def chi2_pvalue(counts, probs):
    """Goodness of fit of observed counts (dict) to probs (cells with p > 0);
    a single observation in a p = 0 cell fails outright."""
    n = sum(counts.values())
    for y, c in counts.items():
        if not (0 <= y < len(probs)) or probs[y] == 0:
            return 0.0
    cells = [i for i, p in enumerate(probs) if p > 0]
    if len(cells) == 1:
        return 1.0
    stat = sum((counts.get(i, 0) - n * probs[i]) ** 2 / (n * probs[i]) for i in cells)
    return chi2_sf(stat, len(cells) - 1)


ALPHA = 1e-4  # seeds are fixed, so this is deterministic; it is about power

# A toy model over 4 tokens: P0 the first token's law, Q[a] the second's
# after a. A tree's node holds the row of the context it ends.
P0 = np.array([0.1, 0.3, 0.4, 0.2])
Q = np.array([[0.25, 0.25, 0.25, 0.25],
              [0.6, 0.1, 0.2, 0.1],
              [0.05, 0.5, 0.15, 0.3],
              [0.4, 0.4, 0.1, 0.1]])
SHAPES = {
    "chain": ([2, 1], [-1, 0]),
    "tree": ([2, 1, 2, 0, 3], [-1, -1, -1, 1, 0]),  # node 2 duplicates node 0: never reached
}


def _first_two(shape, seed, N=20000, scale=1.0):
    """(t1, t2) counts over N steps of accept_sample on the toy model; where
    the walk stops after one token, the next step's draw gives t2."""
    tokens, parents = SHAPES[shape]
    # node i's row: the model's law after the path to it (for a child of
    # the root, Q[its token]; deeper rows are not checked)
    rows = [P0] + [Q[t] for t in tokens]
    probs = (np.array(rows) * scale).astype(np.float32)
    depth = tree_depth(parents)
    rng = np.random.default_rng(seed)
    counts = Counter()
    for _ in range(N):
        path, accepted = pld.accept_sample(tokens, probs, rng.random(1 + depth).tolist(), parents)
        if len(accepted) < 2:
            accepted += pld.accept_sample([], Q[accepted[0]][None].astype(np.float32), [rng.random()])[1]
        counts[accepted[0] * 4 + accepted[1]] += 1
    return counts


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_sampling_keeps_the_models_law_of_two_tokens(shape):
    counts = _first_two(shape, seed={"chain": 7, "tree": 8}[shape])
    law = (P0[:, None] * Q).ravel()
    assert chi2_pvalue(counts, law) > ALPHA
    # power: the same draws are rejected against a visibly different law
    wrong = (P0[:, None] * Q[[0, 2, 1, 3]]).ravel()  # the rows after 1 and 2 swapped
    assert chi2_pvalue(counts, wrong) < ALPHA
    assert chi2_pvalue(counts, np.outer(P0, P0).ravel()) < ALPHA  # t2 independent of t1


def test_sampling_law_with_unnormalised_rows():
    counts = _first_two("tree", seed=11, N=10000, scale=7.0)
    assert chi2_pvalue(counts, (P0[:, None] * Q).ravel()) > ALPHA


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_sampling_keeps_the_first_tokens_law_torch_dtypes(dtype):
    torch = _torch()
    p = [0.125, 0.25, 0.0625, 0.5, 0.0625]  # exact in every dtype
    t = torch.tensor([p, p, p], dtype=getattr(torch, dtype))
    rng = np.random.default_rng(99)
    c = Counter(pld.accept_sample([1, 3], t, rng.random(2).tolist(), [-1, -1])[1][0] for _ in range(20000))
    assert chi2_pvalue(c, p) > ALPHA


# ============================================================ in the loop
@pytest.mark.torch
@settings(max_examples=EX // 2)
@given(case=sample_cases())
def test_device_draws_are_the_c_draws(case):
    """pld.accept_walk.draws (the rule the loop uses off the CPU: every
    position's draw at once, then the C walk along them) gives C's tokens;
    on the tests' device (models_fixtures.DEVICE: CPU tensors unless
    PLD_TEST_DEVICE names a GPU)."""
    torch = _torch()
    from models_fixtures import DEVICE
    from pld import accept_walk

    tokens, parents, rows, u = case
    depths = [0] * (1 + len(tokens))
    for i, p in enumerate(parents):
        depths[1 + i] = depths[1 + p] + 1 if p >= 0 else 1
    probs = torch.tensor(rows[:1 + len(tokens)], dtype=torch.float32, device=DEVICE)
    choices = accept_walk.draws(probs, torch.tensor(u, dtype=torch.float64), depths)
    assert pld.accept_greedy(tokens, choices, parents) == pld.accept_sample(tokens, probs.cpu(), u, parents)
    probs[0, 0] = float("nan")
    assert accept_walk.draws(probs, torch.tensor(u, dtype=torch.float64), depths)[0] == -1


@pytest.mark.torch
def test_deterministic_mode_draws_on_the_host():
    """A device's draw takes a floating-point cumsum, which torch refuses on
    CUDA under ``torch.use_deterministic_algorithms(True)``: then the probs
    are drawn from in C on the host (the same tokens), as on the CPU."""
    torch = _torch()
    from pld.accept_walk import draws_on_host

    off_cpu = torch.empty(2, 5, device="meta")  # (a tensor off the CPU: its device alone is read)
    assert draws_on_host(torch.empty(2, 5))
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        assert not draws_on_host(off_cpu)
        torch.use_deterministic_algorithms(True)
        assert draws_on_host(off_cpu)
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.torch
def test_uniforms_spend_one_a_token_drawn():
    """A row takes 1 + depth uniforms of its stream, then the stream
    stands as if it had drawn one a token: the next step's first uniform
    is the one after the last token's, whatever depth was verified; the
    stream never touches torch's default generator."""
    torch = _torch()
    from pld.accept_walk import UniformStream, Uniforms

    whole = torch.rand(200, generator=torch.Generator().manual_seed(3), dtype=torch.float64).tolist()
    stream = UniformStream(3)
    state = torch.random.get_rng_state()
    at = 0
    for depth, drawn in [(0, 1), (3, 1), (3, 2), (3, 4), (5, 3), (80, 70), (0, 1)]:
        u = Uniforms([depth], stream)
        assert u.u.tolist() == whole[at:at + depth + 1]
        u.spend(drawn)
        at += drawn
    assert stream.peek(1).item() == whole[at]
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.manual_seed(4)
    seeds = UniformStream.seeds(3)
    torch.manual_seed(4)
    assert seeds == [UniformStream.seeds(1)[0] for _ in range(3)]  # a row's seed: the same one at a time


@pytest.mark.torch
@pytest.mark.parametrize("tree", [False, True])
def test_the_loop_accepts_in_c(tree, monkeypatch):
    """Sampling with row-wise warpers walks in C (accept_sample once a row
    and step, never the Python walk); greedy calls accept_greedy and draws
    nothing from torch's generator; a processor that reads the path walks
    in Python."""
    torch = _torch()
    import random

    import models_fixtures as mf
    from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    from pld import _core, accept_walk

    calls = Counter()
    for name in ("accept_greedy", "accept_sample"):
        real = getattr(_core, name)
        monkeypatch.setattr(_core, name, lambda *a, _real=real, _name=name, **k: (calls.update([_name]),
                                                                                   _real(*a, **k))[1])
    picker = accept_walk.Picker.__call__
    monkeypatch.setattr(accept_walk.Picker, "__call__",
                        lambda self, p: (calls.update(["python"]), picker(self, p))[1])
    model = mf.tiny_model("llama")
    ids = mf.as_ids(mf.repeated_prompt(random.Random("loop-c")))
    torch.manual_seed(1)
    out = pld.generate(model, ids, max_new_tokens=16, eos_token_id=None, do_sample=True, temperature=1.3,
                       top_k=20, draft_tree=tree, record_steps=True)
    assert calls["accept_sample"] == out.stats.steps and calls["python"] == 0
    calls.clear()
    state = torch.random.get_rng_state()
    pld.generate(model, ids, max_new_tokens=16, eos_token_id=None, draft_tree=tree)
    assert calls["accept_greedy"] > 0 and calls["accept_sample"] == 0 and calls["python"] == 0
    assert torch.equal(torch.random.get_rng_state(), state)
    calls.clear()
    pld.generate(model, ids, max_new_tokens=8, eos_token_id=None, draft_tree=tree,
                 logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3)]))
    assert calls["python"] > 0 and calls["accept_greedy"] == 0
