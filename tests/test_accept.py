"""Acceptance of a draft: greedy (ids, logits) and speculative sampling.

Sampling is checked three ways: (a) seeded reproducibility and the
documented generator (xoshiro256** seeded through splitmix64), (b) chi-square
tests that the output distribution is the model's distribution, exactly,
(c) the documented deterministic result for given uniforms.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pld

EX = settings().max_examples


def _torch():
    import torch

    return torch


# =========================================================== greedy (ids)
def greedy_ref(draft, chosen):
    n = 0
    while n < len(draft) and draft[n] == chosen[n]:
        n += 1
    return n, list(chosen[: n + 1])


@settings(max_examples=EX)
@given(k=st.integers(0, 12), vocab=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
       form=st.sampled_from(["list", "tuple", "np64", "np32"]))
def test_accept_greedy_ids(k, vocab, seed, form):
    rng = random.Random(seed)
    chosen = [rng.randint(0, vocab - 1) for _ in range(k + 1)]
    # agree on a random prefix, then (maybe) differ
    m = rng.randint(0, k)
    draft = chosen[:m] + [rng.randint(0, vocab - 1) for _ in range(k - m)]
    conv = {"list": list, "tuple": tuple,
            "np64": lambda x: np.array(x, dtype=np.int64),
            "np32": lambda x: np.array(x, dtype=np.int32)}[form]
    n, tokens = pld.accept_greedy(conv(draft), conv(chosen))
    assert (n, tokens) == greedy_ref(draft, chosen)
    assert isinstance(n, int) and isinstance(tokens, list)
    assert n >= m


def test_accept_greedy_hand_checked():
    assert pld.accept_greedy([1, 2, 3], [1, 2, 9, 4]) == (2, [1, 2, 9])
    assert pld.accept_greedy([1, 2, 3], [1, 2, 3, 4]) == (3, [1, 2, 3, 4])
    assert pld.accept_greedy([5, 2, 3], [1, 2, 3, 4]) == (0, [1])
    assert pld.accept_greedy([], [7]) == (0, [7])
    lo, hi = -(2**63), 2**63 - 1
    assert pld.accept_greedy([lo, hi], [lo, hi, -1]) == (2, [lo, hi, -1])
    assert pld.accept_greedy([lo, hi], [lo, lo, -1]) == (1, [lo, lo])


@pytest.mark.torch
def test_accept_greedy_ids_torch():
    torch = _torch()
    for dt in (torch.int32, torch.int64):
        d = torch.tensor([1, 2, 3], dtype=dt)
        c = torch.tensor([1, 2, 9, 4], dtype=dt)
        assert pld.accept_greedy(d, c) == (2, [1, 2, 9])
        assert pld.accept_greedy(d[None], c[None]) == (2, [1, 2, 9])
        big = torch.zeros(8, dtype=dt)
        big[::2] = c
        assert pld.accept_greedy(d, big[::2]) == (2, [1, 2, 9])


# ========================================================= greedy (logits)
def argmax_first(row):
    """The first maximal index; NaN counts as the maximum (like torch)."""
    row = np.asarray(row, dtype=np.float64)
    nan = np.flatnonzero(np.isnan(row))
    if nan.size:
        return int(nan[0])
    return int(np.flatnonzero(row == row.max())[0])


def greedy_logits_ref(draft, rows):
    out = []
    for i in range(len(draft) + 1):
        out.append(argmax_first(rows[i]))
        if i == len(draft) or draft[i] != out[i]:
            break
    return len(out) - 1, out


def make_logits_case(rng, k, V, extra_rows=0, ties=True):
    rows = k + 1 + extra_rows
    if ties:  # small integers: ties are common
        L = rng.integers(-3, 3, size=(rows, V)).astype(np.float32)
    else:
        L = rng.standard_normal((rows, V)).astype(np.float32)
    am = [argmax_first(r) for r in L]
    m = int(rng.integers(0, k + 1))
    draft = am[:m] + [int(rng.integers(0, V)) for _ in range(k - m)]
    return draft, L


@settings(max_examples=EX)
@given(k=st.integers(0, 10), V=st.integers(1, 40), seed=st.integers(0, 2**32 - 1),
       extra=st.integers(0, 2), dtype=st.sampled_from([np.float32, np.float16]),
       ties=st.booleans())
def test_accept_greedy_logits_numpy(k, V, seed, extra, dtype, ties):
    rng = np.random.default_rng(seed)
    draft, L = make_logits_case(rng, k, V, extra, ties)
    L = L.astype(dtype)
    expected = greedy_logits_ref(draft, L[: k + 1].astype(np.float64))
    assert pld.accept_greedy_logits(draft, L) == expected
    assert pld.accept_greedy_logits(np.array(draft, dtype=np.int64), L[None]) == expected
    # a non-contiguous copy of the same logits
    wide = np.zeros((L.shape[0], 2 * V), dtype=dtype)
    wide[:, ::2] = L
    assert pld.accept_greedy_logits(draft, wide[:, ::2]) == expected


@pytest.mark.torch
@settings(max_examples=EX)
@given(k=st.integers(0, 10), V=st.integers(1, 40), seed=st.integers(0, 2**32 - 1),
       extra=st.integers(0, 2), dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
       ties=st.booleans())
def test_accept_greedy_logits_torch(k, V, seed, extra, dtype, ties):
    torch = _torch()
    rng = np.random.default_rng(seed)
    draft, L = make_logits_case(rng, k, V, extra, ties)
    t = torch.from_numpy(L).to(getattr(torch, dtype))
    # reference: torch.argmax (first maximal index) on the exact float32 values
    am = torch.argmax(t.float(), dim=-1).tolist()
    n = 0
    while n < k and draft[n] == am[n]:
        n += 1
    expected = (n, am[: n + 1])
    assert expected == greedy_logits_ref(draft, t.float().numpy())
    assert pld.accept_greedy_logits(draft, t) == expected
    assert pld.accept_greedy_logits(torch.tensor(draft, dtype=torch.int64), t[None]) == expected
    assert pld.accept_greedy_logits(draft, t.T.contiguous().T) == expected  # column-major


@pytest.mark.torch
def test_argmax_nan_and_ties_like_torch():
    torch = _torch()
    nan = float("nan")
    rows = [[1.0, 5.0, 5.0, 2.0], [nan, 1.0, 9.0, 0.0], [0.0, nan, 9.0, nan],
            [-float("inf")] * 4, [3.0, 3.0, 3.0, 3.0], [float("inf"), 1.0, float("inf"), 0.0]]
    for dtype in ("float32", "float16", "bfloat16"):
        for r in rows:
            t = torch.tensor([r], dtype=getattr(torch, dtype))
            expect = int(torch.argmax(t[0]))
            assert expect == argmax_first(r)
            assert pld.accept_greedy_logits([], t) == (0, [expect])


def test_greedy_logits_early_stop_never_reads_later_rows():
    V = 6
    L = np.zeros((4, V), dtype=np.float32)
    L[0, 2] = 1.0
    L[1, 4] = 1.0
    L[2:, :] = np.nan  # rows after the first disagreement: never read
    assert pld.accept_greedy_logits([2, 3, 1], L) == (1, [2, 4])
    assert pld.accept_greedy_logits([0, 3, 1], L) == (0, [2])
    # if the scan went on it would see NaN -> argmax 0
    assert pld.accept_greedy_logits([2, 4, 1], L) == (2, [2, 4, 0])


def test_greedy_logits_extra_rows_ignored():
    L = np.eye(5, dtype=np.float32)  # row i -> argmax i
    assert pld.accept_greedy_logits([0, 1], L) == (2, [0, 1, 2])
    assert pld.accept_greedy_logits([0, 1, 2, 3], L) == (4, [0, 1, 2, 3, 4])
    assert pld.accept_greedy_logits([], L) == (0, [0])


def test_greedy_logits_large_vocab():
    rng = np.random.default_rng(5)
    L = rng.standard_normal((9, 50_000)).astype(np.float32)
    am = L.argmax(axis=1).tolist()
    assert pld.accept_greedy_logits(am[:8], L) == (8, am)
    assert pld.accept_greedy_logits(am[:3] + [am[3] + 1] + am[4:8], L) == (3, am[:4])


# ================================================================ sampling
MASK = (1 << 64) - 1


class XoshiroRef:
    """xoshiro256** seeded through splitmix64, as pld.h documents."""

    def __init__(self, seed):
        seed &= MASK
        self.s = []
        for _ in range(4):
            seed = (seed + 0x9E3779B97F4A7C15) & MASK
            z = seed
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
            self.s.append(z ^ (z >> 31))

    @staticmethod
    def _rotl(x, r):
        return ((x << r) | (x >> (64 - r))) & MASK

    def random(self):
        s = self.s
        result = (self._rotl((s[1] * 5) & MASK, 7) * 9) & MASK
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = self._rotl(s[3], 45)
        return (result >> 11) * 2.0**-53


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**63 - 1, 2**64 - 1])
def test_generator_is_documented_xoshiro(seed):
    g = pld.Generator(seed)
    r = XoshiroRef(seed)
    vals = [g.random() for _ in range(1000)]
    assert vals == [r.random() for _ in range(1000)]
    assert all(0.0 <= v < 1.0 for v in vals)
    assert len(set(vals)) == 1000


def test_generator_reproducible_and_seed_dependent():
    a, b, c = pld.Generator(42), pld.Generator(42), pld.Generator(43)
    sa = [a.random() for _ in range(50)]
    assert sa == [b.random() for _ in range(50)]
    assert sa != [c.random() for _ in range(50)]


def test_accept_sample_seeded_reproducibility():
    rng = np.random.default_rng(0)
    P = rng.random((4, 6)).astype(np.float32)
    draft = [1, 3, 0]

    def run(seed):
        g = pld.Generator(seed)
        return [pld.accept_sample(draft, P, generator=g) for _ in range(300)]

    r1, r2, r3 = run(7), run(7), run(8)
    assert r1 == r2
    assert r1 != r3
    # the draws vary from call to call: the generator advances
    assert len(set((n, tuple(t)) for n, t in r1)) > 5
    for n, toks in r1:
        assert 0 <= n <= 3 and len(toks) == n + 1
        assert toks[:n] == draft[:n]
        assert 0 <= toks[n] < 6


def sample_ref(draft, rows, u):
    """pld.h's documented rule in float64, summing in index order."""
    rows = [[float(p) for p in r] for r in rows]
    k = len(draft)
    V = len(rows[0])

    def draw(row, mass, skip, uu):
        target = uu * mass
        acc, last = 0.0, None
        for v in range(V):
            if v == skip or row[v] <= 0.0:
                continue
            last = v
            acc += row[v]
            if target < acc:
                return v
        return last

    out = []
    for i in range(k + 1):
        row = rows[i]
        s = 0.0
        for p in row:
            s += p
        if i < k:
            x = draft[i]
            px = row[x] if 0 <= x < V else 0.0
            if u[i] * s < px:
                out.append(x)
                continue
            out.append(draw(row, s - px, x, u[k]))
            return i, out
        out.append(draw(row, s, None, u[k]))
        return k, out


@st.composite
def sample_cases(draw):
    k = draw(st.integers(0, 6))
    V = draw(st.integers(1, 6))
    # dyadic probabilities (multiples of 1/32): exact in float16 / bfloat16 /
    # float32, so every backend sees the same numbers
    rows = []
    for _ in range(k + 1 + draw(st.integers(0, 1))):
        r = draw(st.lists(st.integers(0, 8), min_size=V, max_size=V))
        if sum(r) == 0:
            r[draw(st.integers(0, V - 1))] = 1
        rows.append([x / 32 for x in r])
    draft = draw(st.lists(st.integers(-1, V), min_size=k, max_size=k))
    u = draw(st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=k + 1, max_size=k + 1))
    return draft, rows, u


@settings(max_examples=EX)
@given(case=sample_cases(), dtype=st.sampled_from([np.float32, np.float16]))
def test_accept_sample_uniforms_deterministic(case, dtype):
    draft, rows, u = case
    k = len(draft)
    P = np.array(rows, dtype=dtype)
    try:
        expected = sample_ref(draft, rows, u)
    except TypeError:  # no mass left: draw returned None
        expected = None
    if expected is None or expected[1][-1] is None:
        with pytest.raises(ValueError, match="probs"):
            pld.accept_sample(draft, P, uniforms=u)
        return
    n, toks = pld.accept_sample(draft, P, uniforms=u)
    assert (n, toks) == expected
    # documented invariants
    for i in range(n):
        assert toks[i] == draft[i]
        assert u[i] * sum(rows[i]) < rows[i][draft[i]]
    if n < k:
        assert toks[n] != draft[n]
        assert rows[n][toks[n]] > 0
    assert pld.accept_sample(draft, P, uniforms=np.array(u)) == expected
    assert pld.accept_sample(draft, P, uniforms=tuple(u), generator=pld.Generator(1)) == expected


@pytest.mark.torch
@settings(max_examples=EX // 2)
@given(case=sample_cases(), dtype=st.sampled_from(["float32", "float16", "bfloat16"]))
def test_accept_sample_uniforms_deterministic_torch(case, dtype):
    torch = _torch()
    draft, rows, u = case
    t = torch.tensor(rows, dtype=getattr(torch, dtype))
    try:
        expected = sample_ref(draft, rows, u)
    except TypeError:
        expected = None
    if expected is None or expected[1][-1] is None:
        with pytest.raises(ValueError, match="probs"):
            pld.accept_sample(draft, t, uniforms=u)
        return
    assert pld.accept_sample(draft, t, uniforms=u) == expected
    assert pld.accept_sample(torch.tensor(draft, dtype=torch.int64), t, uniforms=u) == expected


def test_accept_sample_hand_checked():
    P = np.array([[0.5, 0.25, 0.25, 0.0],
                  [0.0, 0.0, 1.0, 0.0],
                  [0.25, 0.25, 0.25, 0.25]], dtype=np.float32)
    # accept 0 (0.4 * 1 < 0.5), accept 2 (p = 1), bonus from row 2 at u = 0.6 -> token 2
    assert pld.accept_sample([0, 2], P, uniforms=[0.4, 0.0, 0.6]) == (2, [0, 2, 2])
    # reject 0 (0.5 * 1 >= 0.5): draw from {1: .25, 2: .25} at u[k] = 0.6 -> token 2
    assert pld.accept_sample([0, 2], P, uniforms=[0.5, 0.0, 0.6]) == (0, [2])
    assert pld.accept_sample([0, 2], P, uniforms=[0.5, 0.0, 0.4]) == (0, [1])
    # draft 3 has p = 0: always rejected; draw from the full row
    assert pld.accept_sample([3], P, uniforms=[0.0, 0.1]) == (0, [0])
    # a draft id outside the vocabulary has p = 0 too
    assert pld.accept_sample([99], P, uniforms=[0.0, 0.9]) == (0, [2])
    assert pld.accept_sample([-1], P, uniforms=[0.0, 0.9]) == (0, [2])
    # k = 0: just a draw from row 0
    assert pld.accept_sample([], P, uniforms=[0.55]) == (0, [1])
    # rows need not be normalised: the row sum is used
    assert pld.accept_sample([0, 2], P * 8, uniforms=[0.4, 0.0, 0.6]) == (2, [0, 2, 2])
    assert pld.accept_sample([0, 2], P * 8, uniforms=[0.5, 0.0, 0.4]) == (0, [1])


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


DISTS = [
    (np.array([0.1, 0.2, 0.3, 0.4]), 3),
    (np.array([0.05, 0.15, 0.3, 0.1, 0.4]), 0),
    (np.array([0.3, 0.0, 0.2, 0.1, 0.25, 0.15]), 4),
    (np.array([0.3, 0.0, 0.2, 0.1, 0.25, 0.15]), 1),  # draft token has p = 0
    (np.array([0.02, 0.9, 0.03, 0.05]), 1),  # mostly accepted
]


@pytest.mark.parametrize("p,x", DISTS)
def test_sampling_preserves_distribution_k1(p, x):
    V = len(p)
    # row 1 (the bonus row) is a different distribution
    P = np.stack([p, np.full(V, 1.0 / V)]).astype(np.float32)
    g = pld.Generator(1000 + V + x)
    N = 20000
    first = Counter()
    accepted = 0
    for _ in range(N):
        n, toks = pld.accept_sample([x], P, generator=g)
        first[toks[0]] += 1
        accepted += n
    p32 = P[0].astype(np.float64) / P[0].astype(np.float64).sum()
    assert chi2_pvalue(first, p32) > ALPHA
    # accepted exactly when out[0] == x
    assert accepted == first.get(x, 0)
    # power: the same draws are rejected against a visibly different p
    wrong = p32.copy()
    j = int(np.argmax(wrong))
    wrong[j] -= 0.03
    wrong[(j + 1) % V] += 0.03
    if wrong.min() >= 0:
        assert chi2_pvalue(first, wrong) < ALPHA


def test_sampling_joint_k2():
    p0 = np.array([0.25, 0.1, 0.4, 0.15, 0.1])
    p1 = np.array([0.05, 0.5, 0.1, 0.05, 0.3])
    p2 = np.array([0.2, 0.2, 0.2, 0.2, 0.2])
    P = np.stack([p0, p1, p2]).astype(np.float32)
    draft = [2, 1]
    g = pld.Generator(2024)
    N = 20000
    first, second, third, ns = Counter(), Counter(), Counter(), Counter()
    for _ in range(N):
        n, toks = pld.accept_sample(draft, P, generator=g)
        ns[n] += 1
        assert len(toks) == n + 1 and toks[:n] == draft[:n]
        first[toks[0]] += 1
        if n >= 1:  # conditional on accepting draft[0], the next token ~ p1
            second[toks[1]] += 1
        if n == 2:
            third[toks[2]] += 1
    q = [r.astype(np.float64) / r.astype(np.float64).sum() for r in P]
    assert chi2_pvalue(first, q[0]) > ALPHA
    assert chi2_pvalue(second, q[1]) > ALPHA
    assert chi2_pvalue(third, q[2]) > ALPHA
    # n: P(0) = 1 - p0(x0), P(1) = p0(x0)(1 - p1(x1)), P(2) = p0(x0) p1(x1)
    a, b = q[0][2], q[1][1]
    assert chi2_pvalue(ns, [1 - a, a * (1 - b), a * b]) > ALPHA
    # power: the second token is not distributed as p0
    assert chi2_pvalue(second, q[0]) < ALPHA


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_sampling_preserves_distribution_torch_dtypes(dtype):
    torch = _torch()
    p = [0.125, 0.25, 0.0625, 0.5, 0.0625]  # exact in every dtype
    t = torch.tensor([p, p], dtype=getattr(torch, dtype))
    g = pld.Generator(99)
    c = Counter(pld.accept_sample([1], t, generator=g)[1][0] for _ in range(20000))
    assert chi2_pvalue(c, p) > ALPHA
