"""Property tests of pld.NgramIndex.

* policy "first": propose(...) == find_candidate_pred_tokens(tokens, ...)
  under both semantics, as the sequence grows token by token, with random
  truncations and multi-token extends;
* policies "recent" (with 1 to MAX_VOTERS voters) and "frequent": ==
  tests/reference.py ReferenceIndex;
* len / tokens() / nbytes / truncate bookkeeping.
"""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pld
from pld.bench.flood import _unmix32
from reference import ReferenceIndex
from reference import _lookup as lookup_reference

EX = settings().max_examples


def _torch():
    import torch

    return torch


@st.composite
def propose_args(draw, L):
    k = draw(st.integers(1, 12))
    semantics = draw(st.sampled_from(["seed", "transformers"]))
    kw = dict(semantics=semantics)
    if semantics == "transformers":
        kw["max_length"] = draw(st.one_of(st.none(), st.integers(max(1, L - 3), L + k + 3)))
        kw["eos_token_id"] = draw(
            st.one_of(st.none(), st.integers(0, 7), st.lists(st.integers(0, 7), max_size=3))
        )
    return k, kw


def check_against(ix, ref, data, policy):
    seq = ref.tokens()
    assert len(ix) == len(seq)
    assert ix.tokens() == seq
    k, kw = data.draw(propose_args(len(seq)))
    got = ix.propose(k, **kw)
    assert isinstance(got, list)
    assert got == ref.propose(k, **kw), (seq, k, kw)
    if policy == "first":
        assert got == pld.find_candidate_pred_tokens(
            seq, ix.max_ngram_size, k, min_ngram_size=ix.min_ngram_size, **kw
        )
    if not got:
        assert ix.last_ngram == 0
    elif policy != "frequent":
        # the winning size is the largest n whose own lookup proposes
        eos = kw.get("eos_token_id")
        eos = () if eos is None else ((eos,) if isinstance(eos, int) else tuple(eos))
        sizes = range(ix.min_ngram_size, ix.max_ngram_size + 1)
        assert ix.last_ngram == max(
            n for n in sizes
            if lookup_reference(seq, n, k, n, kw["semantics"], kw.get("max_length"), eos,
                                pick_latest=policy == "recent", voters=ix.voters))
    else:
        assert ix.min_ngram_size <= ix.last_ngram <= ix.max_ngram_size


@settings(max_examples=EX)
@given(
    policy=st.sampled_from(["first", "recent", "frequent"]),
    max_n=st.integers(1, 5),
    vocab=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
    n_ops=st.integers(1, 40),
    data=st.data(),
)
def test_index_matches_reference_under_random_ops(policy, max_n, vocab, seed, n_ops, data):
    min_n = data.draw(st.integers(1, max_n))
    voters = data.draw(st.sampled_from([1, 2, 3, 5, pld._core.MAX_VOTERS])) if policy == "recent" else 1
    rng = random.Random(seed)
    ix = pld.NgramIndex(max_n, min_n, policy, voters=voters)
    ref = ReferenceIndex(max_n, min_n, policy, voters=voters)
    assert (ix.max_ngram_size, ix.min_ngram_size, ix.policy, ix.voters) == (max_n, min_n, policy, voters)
    if data.draw(st.booleans()):  # sometimes the first propose comes late
        check_against(ix, ref, data, policy)
    cap = 250 if policy == "frequent" else 600
    for _ in range(n_ops):
        op = data.draw(st.sampled_from(["one", "one", "one", "many", "numpy", "truncate",
                                        "reserve"]))
        if op == "one":
            t = rng.randint(1, vocab)
            ix.extend(t)
            ref.extend(t)
        elif op == "many":
            ts = [rng.randint(1, vocab) for _ in range(rng.randint(0, 40))]
            ix.extend(ts)
            ref.extend(ts)
        elif op == "numpy":
            ts = [rng.randint(1, vocab) for _ in range(rng.randint(1, 40))]
            dt = rng.choice([np.int32, np.int64])
            arr = np.array(ts, dtype=dt)
            if rng.random() < 0.5:  # a contiguous view into a longer array
                arr = np.concatenate([[0], arr, [0]]).astype(dt)[1:-1]
            ix.extend(arr)
            ref.extend(ts)
        elif op == "reserve":  # room for more: no answer changes
            ix.reserve(rng.randint(0, 100))
        else:
            n = rng.randint(0, len(ref) + 3)
            ix.truncate(n)
            ref.truncate(n)
        if len(ref) > cap:
            ix.truncate(cap // 2)
            ref.truncate(cap // 2)
        check_against(ix, ref, data, policy)


@pytest.mark.parametrize("policy,voters", [("first", 1), ("recent", 1), ("recent", 3), ("frequent", 1)])
def test_short_sequences_exhaustive(policy, voters):
    # Every sequence over {1, 2} of length 0..6 (0..8 with voters, where
    # several occurrences must fit), on a fresh index that has never
    # proposed before, for every n-gram range: short sequences are where
    # n > L and the draft outgrows the sequence.
    seqs = [[]]
    for length in range(1, 7 if voters == 1 else 9):
        seqs += [[1 + ((m >> b) & 1) for b in range(length)] for m in range(2**length)]
    for max_n in (1, 2, 3, 4, 5, 64):
        for min_n in sorted({1, 2, max_n}):
            if min_n > max_n:
                continue
            for seq in seqs:
                for k in (1, 2, 5, 12):
                    for sem in ("seed", "transformers"):
                        ix = pld.NgramIndex(max_n, min_n, policy, voters=voters)
                        ix.extend(seq)
                        ref = ReferenceIndex(max_n, min_n, policy, voters=voters)
                        ref.extend(seq)
                        assert ix.propose(k, semantics=sem) == ref.propose(k, semantics=sem), (
                            max_n, min_n, seq, k, sem)


@pytest.mark.parametrize("semantics", ["seed", "transformers"])
@pytest.mark.parametrize("max_n,min_n", [(1, 1), (3, 1), (4, 2), (5, 5), (64, 1), (64, 40)])
def test_first_equals_lookup_token_by_token(semantics, max_n, min_n):
    # A long stream with both short-range and long-range repeats: grows one
    # token at a time (hash tables grow too), checked at every length.
    rng = random.Random(max_n * 100 + min_n)
    seq = []
    while len(seq) < 3000:
        if seq and rng.random() < 0.3:
            a = rng.randrange(len(seq))
            seq += seq[a: a + rng.randint(1, 90)]
        else:
            seq += [rng.randint(1, 40) for _ in range(rng.randint(1, 20))]
    seq = seq[:3000]
    arr = np.array(seq, dtype=np.int64)
    ix = pld.NgramIndex(max_n, min_n, "first")
    hits = 0
    for i, t in enumerate(seq):
        ix.extend(t)
        k = 1 + i % 12
        expected = pld.find_candidate_pred_tokens(
            arr[: i + 1], max_n, k, min_ngram_size=min_n, semantics=semantics
        ).tolist()
        got = ix.propose(k, semantics=semantics)
        assert got == expected, (i, k)
        hits += bool(got)
    assert hits > 100  # the stream really exercises matches
    assert ix.tokens() == seq


@pytest.mark.parametrize("policy", ["first", "recent", "frequent"])
def test_truncate_equals_fresh_index(policy):
    rng = random.Random(7)
    seq = [rng.randint(1, 5) for _ in range(2000)]
    ix = pld.NgramIndex(4, 2, policy)
    ix.extend(seq)
    for new_len in (1999, 1500, 1500, 700, 3, 0):
        ix.truncate(new_len)
        fresh = pld.NgramIndex(4, 2, policy)
        fresh.extend(seq[:new_len])
        assert len(ix) == new_len and ix.tokens() == seq[:new_len]
        for k in (1, 5, 12):
            for sem in ("seed", "transformers"):
                assert ix.propose(k, semantics=sem) == fresh.propose(k, semantics=sem)
        # and it keeps working after the truncation
        ix.extend(seq[new_len: new_len + 50])
        fresh.extend(seq[new_len: new_len + 50])
        assert ix.propose(8) == fresh.propose(8)
        ix.truncate(new_len)


@pytest.mark.parametrize("policy", ["first", "recent", "frequent"])
def test_truncate_at_or_past_len_is_noop(policy):
    ix = pld.NgramIndex(3, 1, policy)
    seq = [1, 2, 3, 1, 2, 4, 1, 2]
    ix.extend(seq)
    before = [ix.propose(k) for k in range(1, 8)]
    nbytes = ix.nbytes
    for n in (len(seq), len(seq) + 1, 10**6, 2**62):
        ix.truncate(n)
        assert len(ix) == len(seq) and ix.tokens() == seq
        assert [ix.propose(k) for k in range(1, 8)] == before
        assert ix.nbytes == nbytes


@pytest.mark.parametrize("policy", ["first", "recent", "frequent"])
def test_len_tokens_nbytes(policy):
    ix = pld.NgramIndex(3, 1, policy)
    assert len(ix) == 0 and ix.tokens() == [] and ix.propose(5) == []
    assert ix.nbytes >= 0
    ix.extend([1, 2, 3])
    small = ix.nbytes
    assert small > 0
    rng = random.Random(0)
    seq = [1, 2, 3] + [rng.randint(0, 10**6) for _ in range(20000)]
    ix.extend(seq[3:])
    assert len(ix) == len(seq) and ix.tokens() == seq
    big = ix.nbytes
    assert big > small
    assert big >= 8 * len(seq)  # it owns an int64 copy of the sequence
    assert big < 2000 * len(seq)  # ...and is not absurdly large
    assert isinstance(ix.tokens(), list)
    # extend with an empty sequence changes nothing
    ix.extend([])
    assert len(ix) == len(seq)


@pytest.mark.parametrize("policy", ["first", "recent", "frequent"])
def test_reserve_then_extends_allocate_nothing(policy):
    """After reserve(n), n single-token extends never grow the index (so a
    step never pays for a rehash), and the answers are those of an index
    that did not reserve."""
    rng = random.Random(7)
    seq = [rng.randint(0, 50 if i % 2 else 5000) for i in range(3000)]
    ix, plain = pld.NgramIndex(3, 1, policy), pld.NgramIndex(3, 1, policy)
    ix.extend(seq[:1000])
    plain.extend(seq[:1000])
    ix.reserve(2000)
    ix.propose(10)  # (nbytes counts propose's scratch buffer too)
    reserved = ix.nbytes
    for tok in seq[1000:]:
        ix.extend(tok)
        plain.extend(tok)
        assert ix.nbytes == reserved
        assert ix.propose(10) == plain.propose(10)
    assert ix.tokens() == seq
    ix.reserve(0)
    assert ix.nbytes == reserved


def test_reserve_refuses_too_many_tokens():
    ix = pld.NgramIndex()
    ix.extend([1, 2, 3])
    with pytest.raises(ValueError, match="reserve"):
        ix.reserve(2**40)
    assert ix.tokens() == [1, 2, 3]


def test_first_files_repeats_only():
    """policy 'first' files an n-gram of size > min only when its last n-1
    tokens repeat: over ids that never repeat it takes what a unigram
    index takes (plus two empty tables), yet finds later repeats."""
    seq = list(range(10, 20010))
    tri, uni = pld.NgramIndex(3, 1, "first"), pld.NgramIndex(1, 1, "first")
    tri.extend(seq)
    uni.extend(seq)
    # two empty tables: 16 slots of 8 bytes and a one-word filter each
    assert tri.nbytes - uni.nbytes <= 2 * (16 * 8 + 8)
    tri.extend(seq[500:503])
    assert tri.propose(4) == seq[503:507]


def test_index_hand_checked():
    seq = [1, 2, 3, 1, 2, 4, 1, 2]
    first = pld.NgramIndex(2, 1, "first")
    recent = pld.NgramIndex(2, 1, "recent")
    first.extend(seq)
    recent.extend(seq)
    assert first.propose(2) == [3, 1]
    assert recent.propose(1) == [4]
    assert recent.propose(2) == [4, 1]
    f = pld.NgramIndex(2, 1, "frequent")
    f.extend([1, 2, 3, 1, 2, 4, 1, 2, 4, 1, 2])
    assert f.propose(5) == [4, 1, 2, 4, 1]
    assert f.propose(5, semantics="transformers", max_length=15) == [4, 1, 2]
    assert f.propose(5, semantics="transformers", eos_token_id=2) == [4, 1]
    assert f.propose(5, semantics="transformers", max_length=12) == []
    t = pld.NgramIndex(1, 1, "frequent")
    t.extend([7, 1, 7, 2, 7, 2, 7, 1, 7])
    assert t.propose(4) == [2, 7, 2, 7]  # tie: 2 reached count 2 first
    t.extend([1, 7])
    assert t.propose(1) == [1]
    t.truncate(9)
    assert t.propose(1) == [2]


def test_voters_hand_checked():
    # "5 6" occurs at 0, 4, 8, 12 (newest last), each followed by two tokens
    seq = [5, 6, 1, 2, 5, 6, 1, 3, 5, 6, 9, 9, 5, 6, 1, 3, 5, 6]
    def index(voters):
        ix = pld.NgramIndex(2, 2, "recent", voters=voters)
        ix.extend(seq)
        return ix
    assert index(1).propose(2) == [1, 3]  # the newest valid occurrence (12) alone
    assert index(2).propose(2) == [1, 3]  # 12 and 8: 1 (the newest's) wins the tie, then 3
    assert index(3).propose(2) == [1, 3]  # 12, 8, 4: 1 two to one; 12 and 4 go on, tie at 3
    assert index(4).propose(2) == [1, 3]  # 1 three to one; then 3 two to one
    ix = index(4)
    ix.extend([1, 2])  # the newest occurrence of "1 2" at 2 has a one-token tail
    # seq + [1, 2]: "1 2" occurs at 2 and 18 (the suffix): only 2 is valid, so 5, 6
    assert ix.propose(2) == [5, 6]
    # under "transformers" a voter leaves when its continuation ends: "6" at 0, 3, 6, 9 (and 12)
    t = pld.NgramIndex(1, 1, "recent", voters=16)
    t.extend([6, 7, 8, 6, 7, 8, 6, 7, 9, 6, 7, 9, 6])
    assert t.propose(3, semantics="transformers") == [7, 9, 6]  # 8, 8, 9, 9: the newest's 9
    assert t.propose(3, semantics="transformers", max_length=11) == [7, 8, 6]  # 9's ends at 7
    assert t.propose(3, semantics="transformers", eos_token_id=9) == [7]
    assert t.voters == 16 and "voters=16" in repr(t)


def test_extreme_ids_in_index():
    lo, hi = -(2**63), 2**63 - 1
    seq = [lo, hi, -1, 0, lo, hi, -1, 5, lo, hi]
    for policy in ("first", "recent", "frequent"):
        ix = pld.NgramIndex(2, 1, policy)
        ix.extend(seq)
        ref = ReferenceIndex(2, 1, policy)
        ref.extend(seq)
        assert ix.tokens() == seq
        for k in (1, 2, 3):
            assert ix.propose(k) == ref.propose(k)
    assert pld.NgramIndex(2, 1, "first").propose(3) == []


@pytest.mark.torch
def test_extend_accepts_torch_tensors():
    torch = _torch()
    seq = [1, 2, 3, 1, 2, 4, 1, 2]
    ix = pld.NgramIndex(2, 1)
    ix.extend(torch.tensor(seq[:3], dtype=torch.int32))
    ix.extend(torch.tensor([seq[3:5]], dtype=torch.int64))  # [1, L]
    big = torch.zeros(6, dtype=torch.int64)
    big[::2] = torch.tensor(seq[5:8])
    ix.extend(big[::2])  # non-contiguous
    assert ix.tokens() == seq
    assert ix.propose(2) == pld.find_candidate_pred_tokens(seq, 2, 2)


@pytest.mark.parametrize("wide", [2**40 + 12345, -7, 2**63 - 1])
def test_unigram_tag_collision_with_wide_id(wide):
    # A unigram probe trusts a matching tag while every unigram seen is in
    # [0, 2^32). An id outside that range has a tag from the general hash,
    # which some in-range id shares: the index must still tell them apart.
    tag = pld._core._ngram_tag([wide], 0)
    twin = _unmix32(tag)  # (the inverse of the key-0 mix)
    assert 0 <= twin < 2**32
    assert pld._core._ngram_tag([twin], 0) == tag  # the two ids collide under key 0
    streams = [
        [twin, 1, wide, 2, twin, 3, wide, 4, twin],
        [wide, 1, twin, 2, wide, 3, twin, 4, wide],
        [twin, 1, twin, 2, wide, 5, twin, 1, wide, 5],
    ]
    for policy in ("first", "recent", "frequent"):
        for seq in streams:
            ix = pld.NgramIndex(2, 1, policy, seed=0)
            ref = ReferenceIndex(2, 1, policy)
            for t in seq:
                ix.extend(t)
                ref.extend(t)
                for k in (1, 2, 3):
                    assert ix.propose(k) == ref.propose(k), (policy, seq, k)
            for n in range(len(seq) - 1, 0, -2):
                ix.truncate(n)
                ref.truncate(n)
                assert ix.propose(2) == ref.propose(2), (policy, seq, n)


_FAULTS_WHILE_DRAFTING = r"""
import resource, pld
ids = list(range(7, 1 << 17, 512))  # one id on each 4 KiB page of the draft-int table
ix = pld.NgramIndex(2, 2, "first")
ix.extend([1, 2, *ids, 1, 2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
draft = ix.propose(len(ids))
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
assert draft == ids, draft[:4]
print(len(ids), after - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts Linux page faults")
def test_first_drafts_take_no_page_faults_in_the_int_table():
    """The table of draft ints (one per id, process-wide) is written at
    import: a fresh process whose first draft carries one id on each of
    its pages takes no fault there. Calloc'ed (or malloc + memset, which
    GCC folds into calloc), each page took two: read, then copy-on-write."""
    out = subprocess.run([sys.executable, "-c", _FAULTS_WHILE_DRAFTING], capture_output=True, text=True,
                         check=True).stdout.split()
    pages, faults = int(out[0]), int(out[1])
    assert pages == 256
    assert faults < pages // 4, f"{faults} page faults while drafting {pages} ids, one a page of the table"
