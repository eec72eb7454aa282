"""Checks of the plain-Python reference (tests/reference.py) itself.

* seed semantics against the method's original torch function, transcribed
  below (with one generalisation: a min_ngram_size parameter whose default
  1 gives back the original loop exactly);
* transformers semantics against transformers' real
  PromptLookupCandidateGenerator.get_candidates, with eos and max_length;
* the index policies against independent formulations and hand-checked
  examples.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import ReferenceIndex, find_candidate_reference

# Every test here uses torch (directly or through the transcribed original).
# torch and transformers are imported lazily, so that a run with
# -m "not torch" (e.g. under sanitizers) never loads them.
pytestmark = pytest.mark.torch


def _torch():
    import torch

    return torch


# --- the original, transcribed ---------------------------------------------
def original_find_candidate_pred_tokens(input_ids, max_ngram_size=3, num_pred_tokens=10,
                                        min_ngram_size=1):
    torch = _torch()
    input_length = input_ids.size(1)

    for ngram_size in range(max_ngram_size, min_ngram_size - 1, -1):
        # Extract the last n tokens as our search ngram
        ngram = input_ids[0, -ngram_size:].tolist()

        # Create sliding windows of size ngram_size
        windows = input_ids.unfold(dimension=1, size=ngram_size, step=1)

        # Convert ngram to a tensor for comparison
        ngram_tensor = torch.tensor(ngram, device=input_ids.device).unsqueeze(0)

        # Find where the windows match the ngram
        matches = (windows == ngram_tensor).all(dim=2)

        # Get the indices of matches
        match_indices = matches.nonzero(as_tuple=True)[1]

        # Iterate through match indices to find a valid continuation
        for idx in match_indices:
            start_idx = idx + ngram_size
            end_idx = start_idx + num_pred_tokens
            # Ensure we don't go beyond the length of input_ids and avoid self-match
            if end_idx <= input_length and start_idx < input_length - ngram_size:
                return input_ids[0, start_idx:end_idx]

    # If no match is found, return an empty tensor
    return torch.tensor([], dtype=torch.long, device=input_ids.device)


def original_seed(seq, max_n, k, min_n=1):
    """The original on a list; n > L is skipped (the original's unfold raises
    there), which pld.h specifies as skipping those sizes."""
    L = len(seq)
    top = min(max_n, L)
    if top < min_n:
        return []
    torch = _torch()
    t = torch.tensor([seq], dtype=torch.long)
    return original_find_candidate_pred_tokens(t, top, k, min_n).tolist()


def transformers_draft(seq, max_n, k, max_length, eos):
    torch = _torch()
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    gen = PromptLookupCandidateGenerator(
        # an id no stream uses stands for "no eos": transformers 4.57 needs a tensor
        eos_token_id=torch.tensor(list(eos) if eos else [10**9], dtype=torch.long),
        num_output_tokens=k,
        max_matching_ngram_size=max_n,
        max_length=max_length,
    )
    t = torch.tensor([seq], dtype=torch.long).reshape(1, len(seq))
    out, _ = gen.get_candidates(t)
    assert out[0, : len(seq)].tolist() == seq
    return out[0, len(seq):].tolist()


# --- strategies --------------------------------------------------------------
@st.composite
def streams(draw, max_len=160):
    vocab = draw(st.integers(1, 6))
    n = draw(st.integers(0, max_len))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    # Sometimes plant a repeat of the tail, so long n-grams match too.
    seq = [rng.randint(1, vocab) for _ in range(n)]
    if n > 8 and draw(st.booleans()):
        a = rng.randrange(0, n - 4)
        seq += seq[a: a + rng.randint(1, 8)]
    return seq


EX = settings().max_examples


@settings(max_examples=EX)
@given(seq=streams(), max_n=st.integers(1, 5), k=st.integers(1, 12), data=st.data())
def test_seed_reference_matches_original(seq, max_n, k, data):
    min_n = data.draw(st.integers(1, max_n))
    assert find_candidate_reference(seq, max_n, k, min_n) == original_seed(seq, max_n, k, min_n)


@settings(max_examples=EX)
@given(seq=streams(), max_n=st.integers(1, 5), k=st.integers(1, 12), data=st.data())
def test_transformers_reference_matches_transformers(seq, max_n, k, data):
    L = len(seq)
    max_length = data.draw(st.one_of(st.none(), st.integers(max(1, L - 3), L + k + 3)))
    eos = data.draw(st.lists(st.integers(0, 7), max_size=3))
    ref = find_candidate_reference(seq, max_n, k, 1, "transformers", max_length, eos)
    hf = transformers_draft(seq, max_n, k, 10**9 if max_length is None else max_length, eos)
    assert ref == hf


def test_transformers_max_length_l_plus_one_is_empty():
    seq = [1, 2, 3, 1, 2]
    assert find_candidate_reference(seq, 2, 3, semantics="transformers") == [3, 1, 2]
    assert transformers_draft(seq, 2, 3, 6, ()) == []
    assert find_candidate_reference(seq, 2, 3, semantics="transformers", max_length=6) == []
    # L + 2 allows 2 tokens -- end = min(start + k, L, max_length) caps at L anyway
    assert find_candidate_reference(seq, 2, 3, semantics="transformers", max_length=7) == [3, 1, 2]


def test_hand_checked_examples():
    # seed: suffix (1, 2) occurs at 0 and 3; earliest wins, full continuation
    seq = [1, 2, 3, 1, 2, 4, 1, 2]
    assert find_candidate_reference(seq, 2, 2) == [3, 1]
    assert original_seed(seq, 2, 2) == [3, 1]
    # continuation must fit completely under seed semantics
    assert find_candidate_reference(seq, 2, 6) == [3, 1, 2, 4, 1, 2]  # i=0: 0+2+6 = 8 <= 8
    assert find_candidate_reference(seq, 2, 7) == []  # nothing fits for n=2 nor n=1
    # transformers clips instead
    assert find_candidate_reference(seq, 2, 7, semantics="transformers") == [3, 1, 2, 4, 1, 2]
    # eos cut, no fall-through to a smaller n
    assert find_candidate_reference(seq, 2, 3, semantics="transformers", eos=[3]) == []
    assert find_candidate_reference(seq, 2, 3, semantics="transformers", eos=[2]) == [3, 1]
    # self-match only: nothing
    assert find_candidate_reference([5, 6, 7], 3, 1) == []
    # seed self-match rule: start < L - n excludes overlapping near-tail matches
    assert find_candidate_reference([1, 1, 1], 1, 1) == [1]  # n=1, i=0: 1 < 2
    assert find_candidate_reference([1, 1], 1, 1) == []  # n=1, i=0: 1 < 1 fails
    assert original_seed([1, 1], 1, 1) == []
    assert find_candidate_reference([1, 1], 1, 1, semantics="transformers") == [1]


# --- index policies ------------------------------------------------------------
def recent_via_original(seq, max_n, k, min_n):
    """The original's loop, walking the matches right to left."""
    L = len(seq)
    for n in range(min(max_n, L), min_n - 1, -1):
        ngram = seq[L - n:]
        idxs = [i for i in range(L - n + 1) if seq[i:i + n] == ngram]
        for idx in reversed(idxs):
            start, end = idx + n, idx + n + k
            if end <= L and start < L - n:
                return seq[start:end]
    return []


def frequent_by_counting(seq, max_n, k, min_n):
    """Frequent policy, computed from final counts: among the followers with
    the highest count, the one whose count reached that value earliest."""
    L = len(seq)
    draft = []
    while len(draft) < k:
        ext = seq + draft
        pick = None
        for n in range(max_n, min_n - 1, -1):
            if n > len(ext):
                continue
            g = ext[len(ext) - n:]
            hits = [j for j in range(n, L) if seq[j - n:j] == g]
            if not hits:
                continue
            counts = {}
            for j in hits:
                counts[seq[j]] = counts.get(seq[j], 0) + 1
            top = max(counts.values())
            when = {}
            for f in counts:
                if counts[f] == top:
                    c = 0
                    for j in hits:
                        if seq[j] == f:
                            c += 1
                            if c == top:
                                when[f] = j
                                break
            pick = min(when, key=when.get)
            break
        if pick is None:
            break
        draft.append(pick)
    return draft


@settings(max_examples=EX)
@given(seq=streams(max_len=80), max_n=st.integers(1, 4), k=st.integers(1, 8), data=st.data())
def test_reference_index_recent_and_frequent(seq, max_n, k, data):
    min_n = data.draw(st.integers(1, max_n))
    r = ReferenceIndex(max_n, min_n, "recent")
    r.extend(seq)
    assert r.propose(k) == recent_via_original(seq, max_n, k, min_n)
    f = ReferenceIndex(max_n, min_n, "frequent")
    f.extend(seq)
    assert f.propose(k) == frequent_by_counting(seq, max_n, k, min_n)
    fi = ReferenceIndex(max_n, min_n, "first")
    fi.extend(seq)
    assert fi.propose(k) == original_seed(seq, max_n, k, min_n)


def test_reference_index_hand_checked():
    seq = [1, 2, 3, 1, 2, 4, 1, 2]
    r = ReferenceIndex(2, 1, "recent")
    r.extend(seq)
    assert r.propose(1) == [4]
    assert r.propose(2) == [4, 1]
    first = ReferenceIndex(2, 1, "first")
    first.extend(seq)
    assert first.propose(2) == [3, 1]

    f = ReferenceIndex(2, 1, "frequent")
    f.extend([1, 2, 3, 1, 2, 4, 1, 2, 4, 1, 2])
    assert f.propose(5) == [4, 1, 2, 4, 1]
    # transformers: at most max_length - L - 1 tokens, cut before eos
    assert f.propose(5, "transformers", max_length=11 + 4) == [4, 1, 2]
    assert f.propose(5, "transformers", eos_token_id=2) == [4, 1]
    assert f.propose(5, "transformers", max_length=12) == []

    # tie: follower 1 is seen first, but 2 reaches count 2 first
    t = ReferenceIndex(1, 1, "frequent")
    t.extend([7, 1, 7, 2, 7, 2, 7, 1, 7])
    assert t.propose(4) == [2, 7, 2, 7]
    t.extend([1, 7])  # now 1 has 3
    assert t.propose(1) == [1]
    t.truncate(9)
    assert t.propose(1) == [2]
    assert len(t) == 9 and t.tokens()[-1] == 7
