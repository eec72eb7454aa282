"""Reference and memory leaks: 100k calls of every entry point, including
calls that raise, must leave the inputs' reference counts where they were
and the process's resident memory flat after a warm-up."""

from __future__ import annotations

import gc
import os
import sys

import numpy as np
import pytest

import pld

N = 100_000
PAGE = os.sysconf("SC_PAGE_SIZE")
# A leak of even 16 bytes per call would show as 1.6 MB over 100k calls.
RSS_SLACK = 1_200_000
# Under ASan (.ci/run sets PLD_SANITIZED=1) freed memory sits in a
# quarantine, so RSS says nothing about leaks there; the reference counts
# still do, and the plain run of the suite checks RSS.
CHECK_RSS = os.environ.get("PLD_SANITIZED") != "1"


def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def _torch():
    import torch

    return torch


def run_flat(fn, objs, n=N, warmup=2000):
    """Call fn() n times; the refcounts of objs and the RSS must stay flat."""
    for _ in range(warmup):  # warm-up: caches, free lists, arenas
        fn()
    gc.collect()
    refs = [sys.getrefcount(o) for o in objs]
    before = rss()
    for _ in range(n):
        fn()
    gc.collect()
    after = rss()
    assert [sys.getrefcount(o) for o in objs] == refs
    if CHECK_RSS:
        assert after - before < RSS_SLACK, f"RSS grew by {after - before} bytes"


def raising(fn, exc=(TypeError, ValueError)):
    def call():
        try:
            fn()
        except exc:
            return
        raise AssertionError("expected an error")

    return call


SEQ = [1, 2, 3, 1, 2, 4, 1, 2] * 8
ARR = np.array(SEQ, dtype=np.int64)
ARR32 = np.array(SEQ, dtype=np.int32)
EOS = [4, 99]


def test_find_candidate_list_no_leak():
    kw = dict(semantics="transformers", max_length=1000, eos_token_id=EOS)

    def fn():
        pld.find_candidate_pred_tokens(SEQ, 3, 5)
        pld.find_candidate_pred_tokens(SEQ, 3, 5, **kw)

    run_flat(fn, [SEQ, EOS] + SEQ[:4])


def test_find_candidate_numpy_no_leak():
    view = np.repeat(ARR, 2)[::2]
    swapped = ARR.astype(ARR.dtype.newbyteorder())

    def fn():
        pld.find_candidate_pred_tokens(ARR, 3, 5)
        pld.find_candidate_pred_tokens(ARR32[None], 2, 7, semantics="transformers")
        raising(lambda: pld.find_candidate_pred_tokens(view, 3, 5))()  # refused buffers
        raising(lambda: pld.find_candidate_pred_tokens(swapped, 3, 5))()

    run_flat(fn, [ARR, ARR32, view, swapped])


def test_find_candidate_errors_no_leak():
    bad_float = np.array([1.0, 2.0])
    batch = np.zeros((2, 3), dtype=np.int64)
    bad_items = [1, 2, "x"]
    big = [1, 2**63]

    def fn():
        raising(lambda: pld.find_candidate_pred_tokens(bad_float))()
        raising(lambda: pld.find_candidate_pred_tokens(batch))()
        raising(lambda: pld.find_candidate_pred_tokens(bad_items))()
        raising(lambda: pld.find_candidate_pred_tokens(big))()
        raising(lambda: pld.find_candidate_pred_tokens(SEQ, 0))()
        raising(lambda: pld.find_candidate_pred_tokens(SEQ, semantics="nope"))()
        raising(lambda: pld.find_candidate_pred_tokens(SEQ, max_length=5))()
        raising(lambda: pld.find_candidate_pred_tokens(SEQ, semantics="transformers",
                                                       eos_token_id=bad_items))()
        raising(lambda: pld.find_candidate_pred_tokens(SEQ, semantics="transformers",
                                                       eos_token_id=bad_float))()

    run_flat(fn, [bad_float, batch, bad_items, big, SEQ], n=N // 4)


@pytest.mark.torch
def test_find_candidate_torch_no_leak():
    torch = _torch()
    t = torch.tensor(SEQ)
    t32 = t.to(torch.int32)[None]
    view = torch.repeat_interleave(t, 2)[::2]
    bad = t.float()

    def fn():
        pld.find_candidate_pred_tokens(t, 3, 5)
        pld.find_candidate_pred_tokens(t32, 3, 5, semantics="transformers")
        pld.find_candidate_pred_tokens(view, 3, 5)
        raising(lambda: pld.find_candidate_pred_tokens(bad))()

    run_flat(fn, [t, t32, view, bad], n=N // 2)


def test_index_propose_extend_no_leak():
    for policy in ("first", "recent", "frequent"):
        ix = pld.NgramIndex(3, 1, policy)
        ix.extend(SEQ)
        eos = [4]

        def fn():
            ix.propose(5)
            ix.propose(5, semantics="transformers", max_length=500, eos_token_id=eos)

        run_flat(fn, [ix, eos], n=N // 2)


def test_index_extend_truncate_no_leak():
    ix = pld.NgramIndex(3, 1, "frequent")
    chunk = [5, 6, 7, 5, 6]
    arr = np.array(chunk, dtype=np.int32)
    bad = [1, "x"]
    bad_arr = np.array([1.5, 2.5])
    bad_batch = np.zeros((2, 2), dtype=np.int64)
    base = len(SEQ)
    ix.extend(SEQ)

    def fn():
        ix.extend(7)
        ix.extend(chunk)
        ix.extend(arr)
        raising(lambda: ix.extend(bad))()
        raising(lambda: ix.extend(bad_arr))()
        raising(lambda: ix.extend(bad_batch))()
        raising(lambda: ix.truncate(-1))()
        ix.truncate(base)

    run_flat(fn, [ix, chunk, arr, bad, bad_arr, bad_batch], n=N // 4)
    assert len(ix) == base and ix.tokens() == SEQ


def test_index_grow_and_free_no_leak():
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 1000, size=5000)

    def fn():
        for policy in ("first", "recent", "frequent"):
            ix = pld.NgramIndex(4, 1, policy)
            ix.extend(toks)
            ix.propose(10)
            ix.truncate(100)
            del ix

    run_flat(fn, [toks], n=200, warmup=30)


def test_accept_no_leak():
    tokens = [1, 2, 3]
    choices = [1, 2, 9, 4]
    tree = [-1, 0, -1]
    P = np.full((4, 50), 0.02, dtype=np.float32)
    u = [0.5, 0.25, 0.125, 0.75]
    bad_u = [0.5]
    nanP = P.copy()
    nanP[0, 0] = np.nan
    int_probs = np.zeros((4, 50), dtype=np.int64)
    float_tokens = np.array([1.0, 2.0])
    bad_parents = [-1, 1, 0]

    def fn():
        pld.accept_greedy(tokens, choices)
        pld.accept_greedy(tokens, choices, tree)
        pld.accept_sample(tokens, P, u)
        pld.accept_sample(tokens, P, u, tree)
        raising(lambda: pld.accept_greedy(tokens, tokens))()
        raising(lambda: pld.accept_greedy(tokens, choices, bad_parents))()
        raising(lambda: pld.accept_sample(tokens, P[:2], u))()
        raising(lambda: pld.accept_sample(tokens, P, bad_u))()
        raising(lambda: pld.accept_sample(tokens, nanP, u))()
        raising(lambda: pld.accept_sample(tokens, int_probs, u))()
        raising(lambda: pld.accept_sample(float_tokens, P, u))()
        raising(lambda: pld.accept_greedy(float_tokens, choices))()

    run_flat(fn, [tokens, choices, tree, P, u, bad_u, nanP, int_probs, float_tokens, bad_parents], n=N // 2)


@pytest.mark.torch
def test_accept_torch_no_leak():
    torch = _torch()
    tokens = torch.tensor([1, 2, 3])
    choices = torch.tensor([1, 2, 9, 4])
    parents = torch.tensor([-1, 0, -1])
    P = torch.full((4, 50), 0.02, dtype=torch.float16)
    u = torch.rand(4, dtype=torch.float64)

    def fn():
        pld.accept_greedy(tokens, choices, parents)
        pld.accept_sample(tokens, P, u, parents)
        raising(lambda: pld.accept_sample(tokens, P[:1], u))()

    run_flat(fn, [tokens, choices, parents, P, u], n=N // 4)


def test_draft_step_no_leak():
    """pld.vllm's C step: a row that follows, one with a pending draft that
    fares, the cut, and calls that raise."""
    from pld import _core

    seq = SEQ[:40]
    rows = np.array([seq + [0] * 10], dtype=np.int32)
    state = _core.DraftState(pld.NgramIndex(3, 1, "recent", seed=0))
    lengths = np.array([40])
    sampled = [[seq[-1]]]
    outcomes = []
    candidate = (0, 1, 1, 3)
    bad_states = [object()]

    def fn():
        state.index.truncate(39)
        state.proposed, state.candidate = 2, candidate
        drafts, candidates, _, _, _, _ = _core.draft_rows([state], rows, 50, lengths, sampled, 4, 100, outcomes,
                                                          True, ())
        _core.send_drafts([state], drafts, candidates, [(2, 1.5)])
        raising(lambda: _core.draft_rows(bad_states, rows, 50, lengths, sampled, 4, 100, outcomes, True, ()))()
        raising(lambda: _core.send_drafts([state], drafts, candidates, [(9, 1.0)]))()
        outcomes.clear()

    state.index.extend(seq[:39])
    run_flat(fn, [state, rows, lengths, sampled, outcomes, candidate, bad_states], n=N // 4)
