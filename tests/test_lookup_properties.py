"""Property tests: pld.find_candidate_pred_tokens (C) == tests/reference.py.

Streams use a small vocabulary (1..6) so that n-gram matches are frequent,
and lengths up to 5000. Every parameter combination is drawn: min_n <= max_n
in 1..5, k in 1..12, both semantics, max_length None or near L, eos sets;
int32 and int64; list / tuple / numpy / torch inputs, [L] and [1, L], and
non-contiguous views (torch's, through DLPack; a strided NumPy view is
refused, its contiguous copy answers).
"""

from __future__ import annotations

import array
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pld
from reference import find_candidate_reference

EX = settings().max_examples

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


def _torch():
    import torch

    return torch


# --- strategies -------------------------------------------------------------
@st.composite
def streams(draw, max_len=5000):
    vocab = draw(st.integers(1, 6))
    # Mostly short streams (fast, and the interesting corner cases live
    # there), sometimes long ones.
    n = draw(st.one_of(st.integers(0, 40), st.integers(0, 400), st.integers(0, max_len)))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    seq = [rng.randint(1, vocab) for _ in range(n)]
    if n > 8 and draw(st.booleans()):
        # end on a copy of an earlier stretch, so the longest n-grams match
        a = rng.randrange(0, n - 4)
        seq += seq[a: a + rng.randint(1, 10)]
    return seq


@st.composite
def lookups(draw, max_len=5000):
    """(seq, max_n, k, kwargs) covering every option of the lookup."""
    seq = draw(streams(max_len))
    max_n = draw(st.integers(1, 5))
    min_n = draw(st.integers(1, max_n))
    k = draw(st.integers(1, 12))
    semantics = draw(st.sampled_from(["seed", "transformers"]))
    kwargs = dict(min_ngram_size=min_n, semantics=semantics)
    if semantics == "transformers":
        L = len(seq)
        kwargs["max_length"] = draw(st.one_of(st.none(), st.integers(max(1, L - 3), L + k + 3)))
        kwargs["eos_token_id"] = draw(
            st.one_of(st.none(), st.integers(0, 7), st.lists(st.integers(0, 7), max_size=3))
        )
    return seq, max_n, k, kwargs


def ref(seq, max_n, k, kwargs):
    eos = kwargs.get("eos_token_id")
    if eos is None:
        eos = ()
    elif isinstance(eos, int):
        eos = (eos,)
    return find_candidate_reference(
        seq, max_n, k, kwargs.get("min_ngram_size", 1), kwargs.get("semantics", "seed"),
        kwargs.get("max_length"), eos,
    )


def as_list(out):
    if isinstance(out, list):
        return out
    return [int(t) for t in out.tolist()]


# --- list / tuple / numpy ---------------------------------------------------------
@settings(max_examples=EX)
@given(case=lookups())
def test_list_input_matches_reference(case):
    seq, max_n, k, kw = case
    expected = ref(seq, max_n, k, kw)
    out = pld.find_candidate_pred_tokens(seq, max_n, k, **kw)
    assert isinstance(out, list)
    assert out == expected
    # one row, [[...]]
    assert pld.find_candidate_pred_tokens([seq], max_n, k, **kw) == expected
    assert as_list(pld.find_candidate_pred_tokens(tuple(seq), max_n, k, **kw)) == expected
    # keyword spelling of the positional arguments
    assert pld.find_candidate_pred_tokens(
        input_ids=seq, max_ngram_size=max_n, num_pred_tokens=k, **kw
    ) == expected


@settings(max_examples=EX)
@given(case=lookups(), dtype=st.sampled_from([np.int32, np.int64]))
def test_numpy_input_matches_reference(case, dtype):
    seq, max_n, k, kw = case
    expected = ref(seq, max_n, k, kw)
    a = np.array(seq, dtype=dtype)
    out = pld.find_candidate_pred_tokens(a, max_n, k, **kw)
    assert isinstance(out, np.ndarray) and out.ndim == 1
    assert as_list(out) == expected
    assert as_list(pld.find_candidate_pred_tokens(a[None, :], max_n, k, **kw)) == expected
    # a contiguous view into a longer buffer
    big = np.zeros(len(seq) + 2, dtype=dtype)
    big[1:-1] = a
    assert as_list(pld.find_candidate_pred_tokens(big[1:-1], max_n, k, **kw)) == expected
    # strided views (every other element, a negative stride, a [1, L] row
    # with a stride) are refused; their contiguous copies answer
    big2 = np.zeros((2, 2 * len(seq)), dtype=dtype)
    big2[1, ::2] = a
    for view in (big2[1, ::2], np.array(seq[::-1], dtype=dtype)[::-1], big2[1:, ::2]):
        if len(seq) > 1:
            with pytest.raises(ValueError, match="input_ids: expected a 1-D C-contiguous"):
                pld.find_candidate_pred_tokens(view, max_n, k, **kw)
        assert as_list(pld.find_candidate_pred_tokens(np.ascontiguousarray(view), max_n, k,
                                                      **kw)) == expected
    # the input is never modified
    assert a.tolist() == seq


@settings(max_examples=EX // 2)
@given(case=lookups(max_len=600), typecode=st.sampled_from(["q", "l", "i"]))
def test_buffer_input_matches_reference(case, typecode):
    seq, max_n, k, kw = case
    buf = array.array(typecode, seq)
    out = pld.find_candidate_pred_tokens(buf, max_n, k, **kw)
    assert as_list(out) == ref(seq, max_n, k, kw)


# --- torch --------------------------------------------------------------------------
@pytest.mark.torch
@settings(max_examples=EX)
@given(case=lookups(), dtype=st.sampled_from(["int32", "int64"]))
def test_torch_input_matches_reference(case, dtype):
    torch = _torch()
    seq, max_n, k, kw = case
    dt = getattr(torch, dtype)
    expected = ref(seq, max_n, k, kw)
    t = torch.tensor(seq, dtype=dt)
    out = pld.find_candidate_pred_tokens(t, max_n, k, **kw)
    assert isinstance(out, torch.Tensor)
    assert out.dtype == torch.int64 and out.dim() == 1 and out.device == t.device
    assert out.tolist() == expected
    assert pld.find_candidate_pred_tokens(t[None, :], max_n, k, **kw).tolist() == expected
    # non-contiguous views give what the contiguous copy gives
    big = torch.zeros(2 * len(seq), dtype=dt)
    big[::2] = t
    view = big[::2]
    assert pld.find_candidate_pred_tokens(view, max_n, k, **kw).tolist() == expected
    assert pld.find_candidate_pred_tokens(view.contiguous(), max_n, k, **kw).tolist() == expected
    big2 = torch.zeros(3, 2 * len(seq), dtype=dt)
    big2[2, 1::2] = t
    assert pld.find_candidate_pred_tokens(big2[2:, 1::2], max_n, k, **kw).tolist() == expected
    # a [L, 1] tensor transposed is a [1, L] view with a non-unit stride
    col = torch.zeros(len(seq), 2, dtype=dt)
    col[:, 0] = t
    assert pld.find_candidate_pred_tokens(col[:, :1].T, max_n, k, **kw).tolist() == expected
    assert t.tolist() == seq


# --- extreme ids ----------------------------------------------------------------------
EXTREME64 = [I64_MIN, I64_MAX, -1, 0, 2**40, I64_MIN + 1, I64_MAX - 1, -(2**40)]
EXTREME32 = [I32_MIN, I32_MAX, -1, 0, 1 << 20, I32_MIN + 1, I32_MAX - 1, -(1 << 20)]


def _mapped(case, perm, extremes):
    """The case with its small ids (and eos ids) mapped to extreme ones."""
    seq, max_n, k, kw = case
    table = [extremes[p] for p in perm]
    kw = dict(kw)
    eos = kw.get("eos_token_id")
    if eos is not None:
        kw["eos_token_id"] = table[eos] if isinstance(eos, int) else [table[e] for e in eos]
    return table, [table[t] for t in seq], kw, eos


@settings(max_examples=EX)
@given(case=lookups(max_len=800), perm=st.permutations(list(range(8))))
def test_extreme_ids_int64(case, perm):
    seq, max_n, k, _ = case
    table, mapped, kw, eos = _mapped(case, perm, EXTREME64)
    expected = ref(mapped, max_n, k, kw)
    # the mapping is a bijection, so the draft is the mapped small-id draft
    small_kw = dict(kw)
    small_kw["eos_token_id"] = eos
    assert expected == [table[t] for t in ref(seq, max_n, k, small_kw)]
    assert pld.find_candidate_pred_tokens(mapped, max_n, k, **kw) == expected
    assert as_list(pld.find_candidate_pred_tokens(np.array(mapped, dtype=np.int64), max_n, k, **kw)) == expected


@settings(max_examples=EX)
@given(case=lookups(max_len=800), perm=st.permutations(list(range(8))))
def test_extreme_ids_int32(case, perm):
    _, max_n, k, _ = case
    _, mapped, kw, _ = _mapped(case, perm, EXTREME32)
    expected = ref(mapped, max_n, k, kw)
    a32 = np.array(mapped, dtype=np.int32)
    assert as_list(pld.find_candidate_pred_tokens(a32, max_n, k, **kw)) == expected
    # same ids widened to int64: same draft (sign extension, not zero extension)
    assert as_list(pld.find_candidate_pred_tokens(a32.astype(np.int64), max_n, k, **kw)) == expected


@pytest.mark.torch
@settings(max_examples=EX // 2)
@given(case=lookups(max_len=800), perm=st.permutations(list(range(8))))
def test_extreme_ids_torch(case, perm):
    torch = _torch()
    seq, max_n, k, kw = case
    kw = dict(kw)
    kw.pop("eos_token_id", None)
    for table, dt in ((EXTREME64, torch.int64), (EXTREME32, torch.int32)):
        table = [table[p] for p in perm]
        mapped = [table[t] for t in seq]
        expected = ref(mapped, max_n, k, kw)
        out = pld.find_candidate_pred_tokens(torch.tensor(mapped, dtype=dt), max_n, k, **kw)
        assert out.dtype == torch.int64
        assert out.tolist() == expected


def test_int32_minus_one_is_not_4294967295():
    # An int32 -1 must be read as -1: the eos id -1 cuts, 2**32 - 1 does not.
    seq = [5, -1, 7, 5]
    a = np.array(seq, dtype=np.int32)
    assert as_list(pld.find_candidate_pred_tokens(a, 1, 3, semantics="transformers")) == [-1, 7, 5]
    assert as_list(pld.find_candidate_pred_tokens(a, 1, 3, semantics="transformers", eos_token_id=-1)) == []
    assert as_list(pld.find_candidate_pred_tokens(
        a, 1, 3, semantics="transformers", eos_token_id=2**32 - 1)) == [-1, 7, 5]


# --- long n-grams ---------------------------------------------------------------------
@pytest.mark.parametrize("max_n", [8, 63, 64, 65, 100])
@pytest.mark.parametrize("semantics", ["seed", "transformers"])
def test_long_ngrams_match_reference(max_n, semantics):
    rng = random.Random(max_n)
    block = [rng.randint(1, 1000) for _ in range(120)]
    # block, filler, the first 110 tokens of block: the suffix matches the
    # start for every n <= 110, and the continuation block[110:120] is there.
    seq = block + [rng.randint(1, 1000) for _ in range(50)] + block[:110]
    for min_n in (1, max_n // 2 or 1, max_n):
        expected = find_candidate_reference(seq, max_n, 10, min_n, semantics)
        assert expected == block[110:120]
        if max_n > 64:
            # the core's n-gram limit: a clear error, never a silently
            # different answer
            with pytest.raises(ValueError, match="max_ngram_size"):
                pld.find_candidate_pred_tokens(seq, max_n, 10, min_ngram_size=min_n,
                                               semantics=semantics)
            continue
        got = pld.find_candidate_pred_tokens(seq, max_n, 10, min_ngram_size=min_n,
                                             semantics=semantics)
        assert got == expected, (max_n, min_n)


@pytest.mark.parametrize("semantics", ["seed", "transformers"])
def test_longest_ngram_wins_at_the_limit(semantics):
    # The 64-gram suffix occurs early (followed by 7s), the 63-gram suffix
    # occurs even earlier (followed by 5s): max_n = 64 must pick the 7s.
    tail = list(range(100, 164))  # 64 distinct tokens
    seq = tail[1:] + [5] * 12 + tail + [7] * 12 + [1, 2] + tail
    assert find_candidate_reference(seq, 64, 10, 1, semantics) == [7] * 10
    assert find_candidate_reference(seq, 63, 10, 1, semantics) == [5] * 10
    assert pld.find_candidate_pred_tokens(seq, 64, 10, semantics=semantics) == [7] * 10
    assert pld.find_candidate_pred_tokens(seq, 63, 10, semantics=semantics) == [5] * 10


def test_small_hand_checked():
    seq = [1, 2, 3, 1, 2, 4, 1, 2]
    f = pld.find_candidate_pred_tokens
    assert f(seq, 2, 2) == [3, 1]
    assert f(seq, 2, 6) == [3, 1, 2, 4, 1, 2]
    assert f(seq, 2, 7) == []
    assert f(seq, 2, 7, semantics="transformers") == [3, 1, 2, 4, 1, 2]
    assert f(seq, 2, 3, semantics="transformers", eos_token_id=[3]) == []
    assert f(seq, 2, 3, semantics="transformers", eos_token_id=2) == [3, 1]
    assert f(seq, 2, 3, semantics="transformers", max_length=9) == []
    assert f(seq, 2, 3, semantics="transformers", max_length=10) == [3, 1, 2]
    assert f(seq, 2, 3, semantics="transformers", max_length=4) == [3, 1]
    assert f(seq, 3, 10, min_ngram_size=3) == []  # (4, 1, 2) occurs once
    assert f([1, 1], 1, 1) == []
    assert f([1, 1, 1], 1, 1) == [1]
    assert f([1, 1], 1, 1, semantics="transformers") == [1]
