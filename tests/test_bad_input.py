"""The bad-input matrix: every public entry point must reject bad arguments
with TypeError or ValueError whose message names the offending argument --
never crash, never return garbage."""

from __future__ import annotations

import array

import numpy as np
import pytest

import pld

GOOD = [1, 2, 3, 1, 2]
F = pld.find_candidate_pred_tokens


def _torch():
    import torch

    return torch


class NoBuffer:
    pass


def _index(policy="first"):
    ix = pld.NgramIndex(3, 1, policy)
    ix.extend(GOOD)
    return ix


def logits(rows, vocab, dtype=np.float32):
    return np.zeros((rows, vocab), dtype=dtype)


def probs(rows, vocab):
    return np.full((rows, vocab), 1.0 / vocab, dtype=np.float32)


def _with(arr, idx, value):
    arr = arr.copy()
    arr[idx] = value
    return arr


# (id, thunk, argument name the message must contain)
CASES = [
    # ---- find_candidate_pred_tokens: input_ids
    ("fc-float-numpy", lambda: F(np.array(GOOD, dtype=np.float32)), "input_ids"),
    ("fc-float64-numpy", lambda: F(np.array(GOOD, dtype=np.float64)), "input_ids"),
    ("fc-float-list", lambda: F([1.0, 2.0, 3.0]), "input_ids"),
    ("fc-float-buffer", lambda: F(array.array("d", [1.0, 2.0])), "input_ids"),
    ("fc-0d-numpy", lambda: F(np.array(5)), "input_ids"),
    ("fc-3d-numpy", lambda: F(np.zeros((1, 1, 5), dtype=np.int64)), "input_ids"),
    ("fc-3d-list", lambda: F([[[1, 2, 3]]]), "input_ids"),
    ("fc-batch2-numpy", lambda: F(np.zeros((2, 5), dtype=np.int64)), "input_ids"),
    ("fc-strided-numpy", lambda: F(np.arange(10)[::2]), "input_ids"),
    ("fc-byte-swapped-numpy", lambda: F(np.arange(5, dtype=">i8")), "input_ids"),
    ("fc-2d-memoryview", lambda: F(memoryview(np.arange(6)).cast("B").cast("q", (2, 3))), "input_ids"),
    ("fc-batch2-list", lambda: F([[1, 2], [3, 4]]), "input_ids"),
    ("fc-ragged", lambda: F([[1, 2], [3]]), "input_ids"),
    ("fc-mixed-nesting", lambda: F([1, [2, 3]]), "input_ids"),
    ("fc-none", lambda: F(None), "input_ids"),
    ("fc-str", lambda: F("hello"), "input_ids"),
    ("fc-bytes", lambda: F(b"\x01\x02\x01"), "input_ids"),
    ("fc-object", lambda: F(NoBuffer()), "input_ids"),
    ("fc-int", lambda: F(5), "input_ids"),
    ("fc-dict", lambda: F({1: 2}), "input_ids"),
    ("fc-set", lambda: F({1, 2}), "input_ids"),
    ("fc-generator", lambda: F(t for t in GOOD), "input_ids"),
    ("fc-str-item", lambda: F([1, "a", 2]), "input_ids"),
    ("fc-none-item", lambda: F([1, None, 2]), "input_ids"),
    ("fc-too-big-id", lambda: F([1, 2**63, 1]), "input_ids"),
    ("fc-too-small-id", lambda: F([1, -(2**63) - 1, 1]), "input_ids"),
    ("fc-huge-id", lambda: F([1, 10**30]), "input_ids"),
    ("fc-uint64-too-big", lambda: F(np.array([1, 2**63, 1], dtype=np.uint64)), "input_ids"),
    # ---- find_candidate_pred_tokens: sizes and options
    ("fc-max-n-0", lambda: F(GOOD, 0), "max_ngram_size"),
    ("fc-max-n-neg", lambda: F(GOOD, -1), "max_ngram_size"),
    ("fc-max-n-none", lambda: F(GOOD, None), "max_ngram_size"),
    ("fc-max-n-str", lambda: F(GOOD, "3"), "max_ngram_size"),
    ("fc-max-n-float", lambda: F(GOOD, 2.0), "max_ngram_size"),
    ("fc-k-0", lambda: F(GOOD, 3, 0), "num_pred_tokens"),
    ("fc-k-neg", lambda: F(GOOD, 3, -5), "num_pred_tokens"),
    ("fc-k-none", lambda: F(GOOD, 3, None), "num_pred_tokens"),
    ("fc-k-float", lambda: F(GOOD, 3, 1.5), "num_pred_tokens"),
    ("fc-min-n-0", lambda: F(GOOD, 3, 5, min_ngram_size=0), "min_ngram_size"),
    ("fc-min-n-neg", lambda: F(GOOD, 3, 5, min_ngram_size=-2), "min_ngram_size"),
    ("fc-min-gt-max", lambda: F(GOOD, 2, 5, min_ngram_size=3), "ngram_size"),
    ("fc-min-n-str", lambda: F(GOOD, 3, 5, min_ngram_size="1"), "min_ngram_size"),
    ("fc-semantics-bogus", lambda: F(GOOD, semantics="bogus"), "semantics"),
    ("fc-semantics-int", lambda: F(GOOD, semantics=1), "semantics"),
    ("fc-max-length-seed", lambda: F(GOOD, max_length=10), "max_length"),
    ("fc-eos-seed", lambda: F(GOOD, eos_token_id=2), "eos_token_id"),
    ("fc-eos-list-seed", lambda: F(GOOD, eos_token_id=[2]), "eos_token_id"),
    ("fc-max-length-str", lambda: F(GOOD, semantics="transformers", max_length="10"), "max_length"),
    ("fc-max-length-float", lambda: F(GOOD, semantics="transformers", max_length=10.0), "max_length"),
    ("fc-eos-str", lambda: F(GOOD, semantics="transformers", eos_token_id="x"), "eos_token_id"),
    ("fc-eos-str-item", lambda: F(GOOD, semantics="transformers", eos_token_id=[1, "x"]), "eos_token_id"),
    ("fc-eos-float", lambda: F(GOOD, semantics="transformers", eos_token_id=1.5), "eos_token_id"),
    ("fc-eos-too-big", lambda: F(GOOD, semantics="transformers", eos_token_id=2**64), "eos_token_id"),
    # ---- NgramIndex constructor
    ("ix-max-n-0", lambda: pld.NgramIndex(0), "max_ngram_size"),
    ("ix-max-n-neg", lambda: pld.NgramIndex(-3), "max_ngram_size"),
    ("ix-max-n-too-big", lambda: pld.NgramIndex(65), "max_ngram_size"),
    ("ix-max-n-str", lambda: pld.NgramIndex("3"), "max_ngram_size"),
    ("ix-max-n-none", lambda: pld.NgramIndex(None), "max_ngram_size"),
    ("ix-min-n-0", lambda: pld.NgramIndex(3, 0), "min_ngram_size"),
    ("ix-min-gt-max", lambda: pld.NgramIndex(2, 3), "ngram_size"),
    ("ix-policy-bogus", lambda: pld.NgramIndex(3, 1, "bogus"), "policy"),
    ("ix-policy-none", lambda: pld.NgramIndex(3, 1, None), "policy"),
    ("ix-policy-int", lambda: pld.NgramIndex(3, 1, 0), "policy"),
    ("ix-policy-kw", lambda: pld.NgramIndex(policy="latest"), "policy"),
    ("ix-voters-0", lambda: pld.NgramIndex(3, 1, "recent", voters=0), "voters"),
    ("ix-voters-too-many", lambda: pld.NgramIndex(3, 1, "recent", voters=17), "voters"),
    ("ix-voters-str", lambda: pld.NgramIndex(3, 1, "recent", voters="4"), "voters"),
    ("ix-voters-float", lambda: pld.NgramIndex(3, 1, "recent", voters=4.0), "voters"),
    ("ix-voters-first", lambda: pld.NgramIndex(3, 1, voters=2), "voters"),
    ("ix-voters-frequent", lambda: pld.NgramIndex(3, 1, "frequent", voters=16), "voters"),
    ("ix-voters-positional", lambda: pld.NgramIndex(3, 1, "recent", None, 4), "NgramIndex"),
    # ---- NgramIndex.propose
    ("ix-propose-k-neg", lambda: _index().propose(-1), "num_pred_tokens"),
    ("ix-propose-k-none", lambda: _index().propose(None), "num_pred_tokens"),
    ("ix-propose-k-str", lambda: _index().propose("2"), "num_pred_tokens"),
    ("ix-propose-semantics", lambda: _index().propose(3, semantics="bogus"), "semantics"),
    ("ix-propose-max-length-seed", lambda: _index().propose(3, max_length=9), "max_length"),
    ("ix-propose-eos-seed", lambda: _index().propose(3, eos_token_id=1), "eos_token_id"),
    ("ix-propose-eos-str", lambda: _index().propose(3, semantics="transformers", eos_token_id="e"),
     "eos_token_id"),
    ("ix-propose-max-length-str", lambda: _index("frequent").propose(3, semantics="transformers",
                                                                     max_length="9"), "max_length"),
    # ---- NgramIndex.reserve
    ("ix-reserve-neg", lambda: _index().reserve(-1), r"\bn\b"),
    ("ix-reserve-str", lambda: _index().reserve("1"), r"\bn\b"),
    ("ix-reserve-none", lambda: _index().reserve(None), r"\bn\b"),
    ("ix-reserve-float", lambda: _index().reserve(1.0), r"\bn\b"),
    ("ix-reserve-huge", lambda: _index().reserve(2**70), r"\bn\b"),
    # ---- NgramIndex.truncate
    ("ix-truncate-neg", lambda: _index().truncate(-1), r"\bn\b|new_len|length"),
    ("ix-truncate-str", lambda: _index().truncate("1"), r"\bn\b|new_len|length"),
    ("ix-truncate-none", lambda: _index().truncate(None), r"\bn\b|new_len|length"),
    ("ix-truncate-float", lambda: _index().truncate(1.0), r"\bn\b|new_len|length"),
    # ---- accept_greedy(tokens, choices, parents=None)
    ("ag-choices-short", lambda: pld.accept_greedy([1, 2], [1, 2]), "choices"),
    ("ag-choices-none", lambda: pld.accept_greedy([1, 2], None), "choices"),
    ("ag-choices-float", lambda: pld.accept_greedy([1], np.array([1.0, 2.0])), "choices"),
    ("ag-choices-too-big", lambda: pld.accept_greedy([1], [1, 2**63]), "choices"),
    ("ag-choices-str", lambda: pld.accept_greedy([1], "ab"), "choices"),
    ("ag-tokens-none", lambda: pld.accept_greedy(None, [1]), "tokens"),
    ("ag-tokens-float", lambda: pld.accept_greedy(np.array([1.0]), [1, 2]), "tokens"),
    ("ag-tokens-str", lambda: pld.accept_greedy("ab", [1, 2, 3]), "tokens"),
    ("ag-tokens-batch", lambda: pld.accept_greedy([[1], [2]], [1, 2]), "tokens"),
    ("ag-tokens-too-big", lambda: pld.accept_greedy([2**64], [1, 2]), "tokens"),
    ("ag-parents-self", lambda: pld.accept_greedy([1, 2], [1, 2, 3], [-1, 1]), "parents"),
    ("ag-parents-later", lambda: pld.accept_greedy([1, 2, 3], [1, 2, 3, 4], [-1, 2, 0]), "parents"),
    ("ag-parents-first-not-root", lambda: pld.accept_greedy([1], [1, 2], [0]), "parents"),
    ("ag-parents-below-root", lambda: pld.accept_greedy([1, 2], [1, 2, 3], [-1, -2]), "parents"),
    ("ag-parents-short", lambda: pld.accept_greedy([1, 2], [1, 2, 3], [-1]), "parents"),
    ("ag-parents-long", lambda: pld.accept_greedy([1], [1, 2], [-1, 0]), "parents"),
    ("ag-parents-float", lambda: pld.accept_greedy([1], [1, 2], np.array([-1.0])), "parents"),
    ("ag-parents-str", lambda: pld.accept_greedy([1], [1, 2], "a"), "parents"),
    ("ag-parents-object", lambda: pld.accept_greedy([1], [1, 2], NoBuffer()), "parents"),
    ("ag-parents-too-big", lambda: pld.accept_greedy([1], [1, 2], [2**63]), "parents"),
    # ---- accept_sample(tokens, probs, uniforms, parents=None)
    ("as-probs-list-of-lists-int", lambda: pld.accept_sample([1], [[1, 2], [3, 4]], [0.1, 0.1]),
     "probs"),
    ("as-nan", lambda: pld.accept_sample([1], _with(probs(2, 4), (0, 2), np.nan), [0.5, 0.5]), "probs"),
    ("as-negative", lambda: pld.accept_sample([1], _with(probs(2, 4), (0, 0), -0.1), [0.5, 0.5]),
     "probs"),
    ("as-inf", lambda: pld.accept_sample([1], _with(probs(2, 4), (0, 3), np.inf), [0.5, 0.5]), "probs"),
    ("as-all-zero", lambda: pld.accept_sample([1], np.zeros((2, 4), dtype=np.float32), [0.5, 0.5]),
     "probs"),
    ("as-visited-row-nan", lambda: pld.accept_sample(
        [1], _with(_with(np.zeros((2, 4), dtype=np.float32), (0, 1), 1.0), (1, 0), np.nan),
        [0.5, 0.5]), "probs"),
    ("as-too-few-rows", lambda: pld.accept_sample([1, 2], probs(2, 4), [0.1, 0.1, 0.1]), "probs"),
    ("as-too-few-rows-tree", lambda: pld.accept_sample([1, 2], probs(2, 4), [0.1, 0.1], [-1, -1]),
     "probs"),
    ("as-vocab-0", lambda: pld.accept_sample([1], np.zeros((2, 0), dtype=np.float32), [0.1, 0.1]),
     "probs"),
    ("as-1d", lambda: pld.accept_sample([1], np.full(4, 0.25, dtype=np.float32), [0.1, 0.1]), "probs"),
    ("as-int-probs", lambda: pld.accept_sample([1], np.ones((2, 4), dtype=np.int64), [0.1, 0.1]),
     "probs"),
    ("as-float64-probs", lambda: pld.accept_sample([1], np.full((2, 4), 0.25), [0.1, 0.1]), "probs"),
    ("as-probs-none", lambda: pld.accept_sample([1], None, [0.1, 0.1]), "probs"),
    ("as-probs-object", lambda: pld.accept_sample([1], NoBuffer(), [0.1, 0.1]), "probs"),
    ("as-uniforms-short", lambda: pld.accept_sample([1, 2], probs(3, 4), [0.1, 0.1]), "uniforms"),
    ("as-uniforms-short-tree", lambda: pld.accept_sample([1, 2, 3], probs(4, 4), [0.1, 0.1],
                                                         [-1, -1, 1]), "uniforms"),
    ("as-uniforms-empty", lambda: pld.accept_sample([], probs(1, 4), []), "uniforms"),
    ("as-uniforms-one", lambda: pld.accept_sample([1], probs(2, 4), [1.0, 0.5]), "uniforms"),
    ("as-uniforms-neg", lambda: pld.accept_sample([1], probs(2, 4), [0.5, -0.1]), "uniforms"),
    ("as-uniforms-nan", lambda: pld.accept_sample([1], probs(2, 4), [float("nan"), 0.5]), "uniforms"),
    ("as-uniforms-unused-bad", lambda: pld.accept_sample([1], probs(2, 4), [0.5, 0.5, 2.0]), "uniforms"),
    ("as-uniforms-str", lambda: pld.accept_sample([1], probs(2, 4), "ab"), "uniforms"),
    ("as-uniforms-none", lambda: pld.accept_sample([1], probs(2, 4), None), "uniforms"),
    ("as-uniforms-int", lambda: pld.accept_sample([1], probs(2, 4), 3), "uniforms"),
    ("as-uniforms-object", lambda: pld.accept_sample([1], probs(2, 4), [NoBuffer(), 0.5]), "uniforms"),
    ("as-tokens-float", lambda: pld.accept_sample(np.array([1.5]), probs(2, 4), [0.1, 0.1]), "tokens"),
    ("as-tokens-none", lambda: pld.accept_sample(None, probs(2, 4), [0.1, 0.1]), "tokens"),
    ("as-parents-bad", lambda: pld.accept_sample([1, 2], probs(3, 4), [0.1, 0.1, 0.1], [-1, 5]),
     "parents"),
    ("as-parents-short", lambda: pld.accept_sample([1, 2], probs(3, 4), [0.1, 0.1, 0.1], [-1]),
     "parents"),
    ("as-parents-float", lambda: pld.accept_sample([1], probs(2, 4), [0.1, 0.1], [-1.0]), "parents"),
]


def _t_float(dtype):
    torch = _torch()
    return torch.tensor(GOOD, dtype=getattr(torch, dtype))


TORCH_CASES = [
    ("fc-torch-float32", lambda: F(_t_float("float32")), "input_ids"),
    ("fc-torch-float16", lambda: F(_t_float("float16")), "input_ids"),
    ("fc-torch-bfloat16", lambda: F(_t_float("bfloat16")), "input_ids"),
    ("fc-torch-bool", lambda: F(_t_float("bool")), "input_ids"),
    ("fc-torch-0d", lambda: F(_torch().tensor(3)), "input_ids"),
    ("fc-torch-3d", lambda: F(_torch().zeros(1, 1, 5, dtype=_torch().int64)), "input_ids"),
    ("fc-torch-batch2", lambda: F(_torch().zeros(2, 5, dtype=_torch().int64)), "input_ids"),
    ("fc-torch-batch0", lambda: F(_torch().zeros(0, 5, dtype=_torch().int64)), "input_ids"),
    ("fc-torch-complex", lambda: F(_torch().zeros(5, dtype=_torch().complex64)), "input_ids"),
    ("ix-extend-torch-float", lambda: _index().extend(_t_float("float32")), "tokens"),
    ("ix-extend-torch-batch2", lambda: _index().extend(_torch().zeros(2, 3, dtype=_torch().int64)),
     "tokens"),
    ("fc-torch-meta", lambda: F(_torch().zeros(1, 5, dtype=_torch().int64, device="meta")),
     "input_ids"),
    ("fc-torch-requires-grad", lambda: F(_torch().zeros(1, 5, requires_grad=True)), "input_ids"),
    ("ag-torch-choices-float", lambda: pld.accept_greedy([1], _torch().zeros(2)), "choices"),
    ("ag-torch-parents-float", lambda: pld.accept_greedy([1], [1, 2], _torch().zeros(1)), "parents"),
    ("as-torch-int", lambda: pld.accept_sample([1], _torch().zeros(2, 5, dtype=_torch().int64), [0.1, 0.1]),
     "probs"),
    ("as-torch-too-few-rows", lambda: pld.accept_sample([1, 2, 3], _torch().zeros(3, 5), [0.1] * 4),
     "probs"),
    ("as-torch-batch2", lambda: pld.accept_sample([1], _torch().zeros(2, 2, 5), [0.1, 0.1]), "probs"),
    ("as-torch-nan", lambda: pld.accept_sample(
        [0], _torch().tensor([[0.5, float("nan")], [0.5, 0.5]]), [0.9, 0.1]), "probs"),
    ("as-torch-negative-bf16", lambda: pld.accept_sample(
        [0], _torch().tensor([[0.5, -0.5], [0.5, 0.5]], dtype=_torch().bfloat16), [0.9, 0.1]), "probs"),
    ("as-torch-tokens-float", lambda: pld.accept_sample(
        _torch().tensor([1.0]), _torch().full((2, 4), 0.25), [0.1, 0.1]), "tokens"),
    ("as-torch-uniforms-0d", lambda: pld.accept_sample(
        [], _torch().full((1, 4), 0.25), _torch().tensor(0.5)), "uniforms"),
    ("as-torch-uniforms-short", lambda: pld.accept_sample(
        [1], _torch().full((2, 4), 0.25), _torch().rand(1, dtype=_torch().float64)), "uniforms"),
]


@pytest.mark.parametrize("thunk,arg", [pytest.param(t, a, id=i) for i, t, a in CASES])
def test_bad_input_raises_naming_argument(thunk, arg):
    with pytest.raises((TypeError, ValueError), match=arg):
        thunk()


@pytest.mark.torch
@pytest.mark.parametrize("thunk,arg", [pytest.param(t, a, id=i) for i, t, a in TORCH_CASES])
def test_bad_torch_input_raises_naming_argument(thunk, arg):
    with pytest.raises((TypeError, ValueError), match=arg):
        thunk()


# ---- NgramIndex.extend: must raise AND leave the index unchanged
EXTEND_CASES = [
    ("float", 1.5),
    ("str", "abc"),
    ("bytes", b"\x01\x02"),
    ("none", None),
    ("object", NoBuffer()),
    ("float-numpy", np.array([1.0, 2.0])),
    ("0d-numpy-float", np.array(1.5)),
    ("3d-numpy", np.zeros((1, 1, 3), dtype=np.int64)),
    ("batch2", [[1, 2], [3, 4]]),
    ("batch2-numpy", np.zeros((2, 3), dtype=np.int64)),
    ("one-row-numpy", np.zeros((1, 3), dtype=np.int64)),
    ("strided-numpy", np.arange(6)[::2]),
    ("byte-swapped-numpy", np.arange(3, dtype=">i4")),
    ("too-big-int", 2**63),
    ("too-small-int", -(2**63) - 1),
    ("too-big-in-list", [1, 2, 2**63]),
    ("str-in-list", [1, 2, "x"]),
    ("uint64-too-big", np.array([7, 2**63], dtype=np.uint64)),
]


@pytest.mark.parametrize("policy", ["first", "recent", "frequent"])
@pytest.mark.parametrize("bad", [pytest.param(v, id=i) for i, v in EXTEND_CASES])
def test_bad_extend_raises_and_leaves_index_unchanged(policy, bad):
    ix = _index(policy)
    before = (len(ix), ix.tokens(), [ix.propose(k) for k in (1, 4, 10)])
    with pytest.raises((TypeError, ValueError), match="tokens"):
        ix.extend(bad)
    assert (len(ix), ix.tokens(), [ix.propose(k) for k in (1, 4, 10)]) == before
    ix.extend(3)  # still usable
    assert ix.tokens() == GOOD + [3]


def test_propose_zero_tokens_is_empty_or_rejected():
    ix = _index()
    try:
        out = ix.propose(0)
    except ValueError as e:
        assert "num_pred_tokens" in str(e)
    else:
        assert out == []


def test_errors_do_not_poison_later_calls():
    for _ in range(3):
        with pytest.raises((TypeError, ValueError)):
            F(np.zeros((2, 2), dtype=np.int64))
        assert F(GOOD, 2, 3) == [3, 1, 2]
