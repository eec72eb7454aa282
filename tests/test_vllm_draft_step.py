"""The drafter's step in C (pld._core.draft_rows, send_drafts and
DraftState): a step where every row is still the request last seen there
runs in one call, and must draft, learn and move its states exactly as the
Python step does. No torch: these run under the sanitizers too.
"""
from __future__ import annotations

import logging
import random

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pld.vllm
from pld import _core
from pld.acceptance_buckets import NGRAM_BUCKETS, ROW, SUPPORT_BUCKETS
from pld.vllm import HEAD, TAIL, WINDOW, Drafter

from test_vllm_drafter import FakeBatch, config, random_events


def _run(seed, vocab, k, fast, steps=80, rows=5, **options):
    """Drive a drafter through the same events: (what each step returned
    and left in the states and the budget's outcomes, the slow steps)."""
    rng = random.Random(seed)
    batch = FakeBatch(rows, 200, rng, vocab)
    drafter = Drafter(config(k=k, max_model_len=200, max_num_seqs=rows, **options))
    if not fast:
        drafter._rows_in_order = lambda count: None  # every step the Python one
    slow = []
    step = drafter._step
    drafter._step = lambda *a: slow.append(1) or step(*a)
    seen = []
    for _ in range(steps):
        if rng.random() < 0.3:
            random_events(batch, rng, rows, vocab)
        sampled = batch.step()
        out = drafter.propose(sampled, batch.lengths, batch.tokens)
        for rid, draft in zip(batch.order, out):
            batch.drafts[rid] = list(draft)
        states = [drafter.rows.get(i) for i in range(len(batch.order))]
        seen.append((out, [None if s is None else (s.n, s.cursor, s.support, s.proposed, s.predicted, s.candidate)
                           for s in states],
                     None if drafter.budget is None else list(drafter.budget.outcomes),
                     None if drafter.corpus is None else drafter.corpus.sequences()))
    return seen, len(slow)


@pytest.mark.parametrize("fast", [True, False], ids=["c-step", "python-step"])
def test_an_output_ending_this_step_is_learned_after_the_steps_drafts(fast):
    """Row 0 samples its EOS (2) in the step where row 1, with no match of
    its own, drafts from the corpus: row 1 does not see row 0's output yet,
    in the C step as in Python's (the two must draft alike); the corpus
    holds it after the step, and the next step drafts from it."""
    drafter = Drafter(config(k=4, max_model_len=100, adaptive=False, learn=True))
    drafter.corpus.add([45, 46])  # (a corpus with something in it: rows without a match look it up)
    if not fast:
        drafter._rows_in_order = lambda count: None
    steps = []
    step = drafter._step
    drafter._step = lambda *a: steps.append(1) or step(*a)
    tokens = np.zeros((2, 100), dtype=np.int32)
    tokens[0, :17], tokens[1, :17] = list(range(20, 36)) + [40], list(range(3, 19)) + [41]
    drafter.propose([[40], [41]], np.array([17, 17]), tokens)
    tokens[0, 17:21], tokens[1, 17] = [41, 42, 43, 2], 42
    assert drafter.propose([[41, 42, 43, 2], [42]], np.array([21, 18]), tokens) == [[], []]
    assert len(steps) == (1 if fast else 2)
    assert drafter.corpus.sequences() == [[45, 46], [40, 41, 42, 43, 2]]
    tokens[1, 18] = 43  # (row 0 gone: row 1 moves up)
    assert drafter.propose([[43]], np.array([19]), np.ascontiguousarray(tokens[1:])) == [[2]]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 8), k=st.integers(1, 6),
       adaptive=st.booleans(), learn=st.booleans())
@example(seed=4862, vocab=8, k=5, adaptive=False, learn=True)  # (outputs learned mid-step once differed)
def test_the_c_step_drafts_learns_and_moves_its_states_as_the_python_step(seed, vocab, k, adaptive, learn):
    """Rows added, finished, swapped, preempted, resumed and forked now and
    then: the same drafts, the same states after each step (cursor,
    support streak, pending draft) and the same outcomes for the budget,
    whether steady steps run in C or in Python; a corpus too."""
    fast, fast_slow = _run(seed, vocab, k, True, adaptive=adaptive, learn=learn, verify_cost=0.05)
    slow, slow_slow = _run(seed, vocab, k, False, adaptive=adaptive, learn=learn, verify_cost=0.05)
    assert fast == slow
    assert slow_slow == 80


def test_steady_rows_take_the_c_step_and_a_change_the_python_one():
    fast, slow_steps = _run(3, 6, 4, True, steps=200, rows=4, verify_cost=0.05)
    assert slow_steps < 200 // 2
    assert any(d for out, *_ in fast for d in out)
    tokens = np.zeros((1, 300), dtype=np.int32)
    tokens[0, :40] = [i % 9 for i in range(40)]
    drafter = Drafter(config(k=4, max_model_len=300, adaptive=False))
    steps = []
    step = drafter._step
    drafter._step = lambda *a: steps.append(1) or step(*a)
    for n in range(40, 60):
        tokens[0, n - 1] = (n - 1) % 9
        assert drafter.propose([[int(tokens[0, n - 1])]], np.array([n]), tokens) == [[n % 9, (n + 1) % 9,
                                                                                      (n + 2) % 9, (n + 3) % 9]]
    assert len(steps) == 1  # its first step only
    tokens[0, 3] = 99  # another request in the row: the check fails, Python finds it a fresh index
    drafter.propose([[int(tokens[0, 59])]], np.array([60]), tokens)
    assert len(steps) == 2 and drafter.rows[0].index.tokens()[3] == 99


def _seems(held, cursor, row, limit):
    """The row check, in Python: (result, cursor after)."""
    m = min(len(held), limit)
    c = cursor if 0 <= cursor < m else 0
    e = min(c + WINDOW, m)
    if row[:min(m, HEAD)] != held[:min(m, HEAD)] or row[max(m - TAIL, 0):m] != held[max(m - TAIL, 0):m]:
        return False, cursor
    return row[c:e] == held[c:e], e


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_seems_is_the_head_tail_and_rolling_window_check(data):
    held = data.draw(st.lists(st.integers(0, 2), max_size=700))
    row = list(held) + data.draw(st.lists(st.integers(0, 2), max_size=20))
    for _ in range(data.draw(st.integers(0, 3))):  # a few ids changed anywhere
        if row:
            row[data.draw(st.integers(0, len(row) - 1))] = data.draw(st.integers(0, 3))
    limit = data.draw(st.integers(0, len(row)))
    cursor = data.draw(st.integers(-3, 800))
    state = _core.DraftState(_index(held))
    state.cursor = cursor
    pad = data.draw(st.integers(0, 5))
    rows = np.array([7] * pad + row, dtype=np.dtype(data.draw(st.sampled_from(["int32", "int64", "uint16"]))))
    assert (state.seems(rows, pad, limit), state.cursor) == _seems(held, cursor, row, limit)


def _index(seq):
    index = _core.NgramIndex(3, 1, "recent", seed=0)
    index.extend(list(seq))
    return index


def _state(seq):
    return _core.DraftState(_index(seq))


def test_draft_rows_follows_each_row_and_reports_how_the_last_draft_fared():
    seq = [i % 5 for i in range(30)]
    tokens = np.array([seq + [0] * 10, [9] * 40], dtype=np.int32)
    a, b = _state(seq[:25]), _state([9] * 20)
    a.proposed, a.predicted, a.candidate, a.support = 4, 1.5, (ROW, 2, 1, 4), 1
    outcomes = []
    drafts, candidates, corpus_rows, decoding, all_sampled, ended = _core.draft_rows(
        [a, b], tokens, 40, np.array([30, 20]), [[0, 1, 2, 3, 4], []], 6, 100, outcomes, True, ())
    assert drafts == [[0, 1, 2, 3, 4, 0], None] and candidates == [(ROW, 3, 2, 6), None]
    assert corpus_rows == [] and decoding == 1 and all_sampled is False
    assert outcomes == [((ROW, 2, 1), 4, 4, 1.5)] and a.proposed == 0 and a.support == 2 and a.n == 30
    assert b.n == 20  # (not decoding: untouched)
    assert ended is None
    drafts, candidates, corpus_rows, _, _, _ = _core.draft_rows(
        [b], tokens[1:], 40, np.array([21]), [[9]], 6, 22, None, True, ())
    assert drafts == [[9]] and candidates == [(ROW, 3, 1, 1)]  # room for 1 before max_len
    c = _state(list(range(20)))
    out = _core.draft_rows([c], np.arange(40, dtype=np.int64).reshape(1, 40), 40, np.array([21]), [[20]], 6, 100,
                           None, True, ())
    assert out[0] == [[]] and out[1] == [None] and out[2] == [0]  # no match: the corpus may have one


@pytest.mark.parametrize("stop, ended", [((), None), ((7,), None), ((4,), [0]), ((9, 1), [0, 1]), ((0,), [1])])
def test_draft_rows_reports_the_rows_whose_sampled_ids_hold_a_stop_id(stop, ended):
    """Only a decoding row's ids sampled this step count (its last
    len(sampled) ids): not its prompt's, not a prefilling row's."""
    seq = [0, 4, 7] + [5, 6] * 10
    tokens = np.array([seq + [1, 3, 4] + [0] * 5, [8] * 20 + [9, 0] + [0] * 9, [7] * 31], dtype=np.int32)
    states = [_state(seq), _state([8] * 20), _state([7] * 20)]
    out = _core.draft_rows(states, tokens, 31, np.array([26, 22, 20]), [[1, 3, 4], [9, 0], []], 4, 100, None,
                           False, stop)
    assert out[5] == ended


def test_draft_rows_changes_nothing_but_cursors_when_a_row_needs_python():
    seq = list(range(40))
    tokens = np.array([seq, seq], dtype=np.int32)
    a, b = _state(seq[:35]), _state(seq[:35])
    a.proposed, a.candidate = 2, (ROW, 1, 1, 2)
    assert _core.draft_rows([a, b], tokens, 40, np.array([36, 30]), [[35], [29]], 4, 100, [], False, ()) == [1]
    assert (a.n, a.proposed, b.n) == (35, 2, 35)  # b is shorter than its state: another request, matched in full
    assert _core.draft_rows([a, b], tokens, 40, np.array([36, 37]), [[35], [36]], 4, 100, [], False, ()) == [1]
    assert _core.draft_rows([a, b], tokens, 40, np.array([36, 36]), [[35], []], 4, 100, [], False, ()) == [1]
    tokens[1, 2] = 77
    assert _core.draft_rows([a, b], tokens, 40, np.array([36, 36]), [[35], [35]], 4, 100, [], False, ()) == [1]
    assert _core.draft_rows([a], tokens, 40, np.array([41]), [[35]], 4, 100, [], False, ()) == [0]  # past the row
    short = _state(seq[:HEAD - 1])
    assert _core.draft_rows([short], tokens, 40, np.array([HEAD]), [[HEAD - 1]], 4, 100, [], False, ()) == []
    assert _core.draft_rows([a], tokens, 40, np.array([36]), [(35,)], 4, 100, [], False, ()) == [0]  # not a list
    assert a.n == 35 and short.n == HEAD - 1


@pytest.mark.parametrize("args, error", [
    (([], np.zeros((1, 4), np.int32), 4, np.array([1]), [[1]], 4, 10, None, False, ()), TypeError),  # lengths differ
    (((), np.zeros((1, 4), np.int32), 4, np.array([]), [], 4, 10, None, False, ()), TypeError),  # not a list
    (([object()], np.zeros((1, 4), np.int32), 4, np.array([1]), [[1]], 4, 10, None, False, ()), TypeError),
    (([_core.DraftState.__new__(_core.DraftState)], np.zeros((1, 4), np.int32), 4, np.array([1]), [[1]], 4, 10,
      None, False, ()), ValueError),  # not initialised
    (("S", np.zeros((1, 4), np.int32), 0, np.array([1]), [[1]], 4, 10, None, False, ()), ValueError),  # width 0
    (("S", np.zeros((1, 4), np.int32), 5, np.array([1]), [[1]], 4, 10, None, False, ()), ValueError),  # rows short
    (("S", np.zeros((1, 4), np.int32), 4, np.array([], np.int32), [[1]], 4, 10, None, False, ()), ValueError),
    (("S", np.zeros((1, 4), np.int32), 4, np.zeros((1, 1), np.int32), [[1]], 4, 10, None, False, ()), ValueError),
    (("S", np.zeros((1, 4), np.int32), 4, np.array([1.0]), [[1]], 4, 10, None, False, ()), TypeError),
    (("S", np.zeros((1, 4), np.float32), 4, np.array([1]), [[1]], 4, 10, None, False, ()), TypeError),
    (("S", np.zeros((1, 4), np.int32), 4, np.array([1]), [[1]], 0, 10, None, False, ()), ValueError),  # k 0
    (("S", np.zeros((1, 4), np.int32), 4, np.array([1]), [[1]], 1 << 40, 10, None, False, ()), ValueError),
    (("S", np.zeros((1, 4), np.int32), 4, np.array([1]), [[1]], 4, 0, None, False, ()), ValueError),
    (("S", np.zeros((1, 4), np.int32), 4, np.array([1]), [[1]], 4, 10, (), False, ()), TypeError),  # outcomes
    (("S", np.zeros((1, 4), np.int32), 4, np.array([1]), [[1]], 4, 10, None, 1, ()), TypeError),
    (("S", np.zeros((1, 4), np.int32), 4.0, np.array([1]), [[1]], 4, 10, None, False, ()), TypeError),
    (("S", np.zeros((1, 4), np.int32), 4, np.array([1]), [[1]], 4, 10, None, False, [2]), TypeError),  # stop_ids
    (("S", np.zeros((1, 4), np.int32), 4, np.array([1]), [[1]], 4, 10, None, False, (2,) * 17), TypeError),
    (("S", np.zeros((1, 4), np.int32), 4, np.array([1]), [[1]], 4, 10, None, False, (2.0,)), TypeError),
    (("S", np.zeros((1, 4), np.int32), 4, np.array([1]), [[1]], 4, 10, None, False, (1 << 70,)), ValueError),
    (("S", np.zeros((1, 4), np.int32), 4, np.array([1]), [[1]], 4, 10, None, False), TypeError),  # 9 arguments
    (("S",), TypeError),
])
def test_draft_rows_refuses_bad_arguments(args, error):
    state = _state([0])
    args = tuple([state] if isinstance(a, str) and a == "S" else a for a in args)
    with pytest.raises(error):
        _core.draft_rows(*args)
    assert state.n == 1 and state.cursor == 0


def test_a_pending_draft_without_a_candidate_is_an_error_not_a_crash():
    seq = list(range(20))
    state = _state(seq)
    state.proposed = 3  # (Python sets the candidate with it; here it did not)
    with pytest.raises(ValueError, match="candidate"):
        _core.draft_rows([state], np.array([seq + [1]], np.int32), 21, np.array([21]), [[20]], 4, 100, [], False, ())


def _two_pending_rows(dtype=np.int64):
    """Two rows whose states hold their first 40 ids, each with a draft
    pending, and the step that adds each row's 41st id."""
    rng = np.random.default_rng(0)
    tokens = np.zeros((2, 64), dtype)
    states, sampled = [], []
    for i in range(2):
        ids = rng.integers(0, 50, 41)
        tokens[i, :41] = ids
        state = _state(ids[:40].tolist())
        state.proposed, state.predicted, state.candidate = 3, 1.5, (ROW, 1, 1, 3)
        states.append(state)
        sampled.append([int(ids[40])])
    return states, tokens, np.array([41, 41]), sampled


def _unchanged(states):
    return all(s.n == 40 and s.proposed == 3 and s.support == 1 for s in states)


@pytest.mark.parametrize("fault", ["id past int64", "no candidate", "one state twice", "one index twice"])
def test_a_step_refused_for_one_row_changes_no_row(fault):
    """What the second pass would refuse is refused before any row took
    its ids, learned how its draft fared or filed an outcome."""
    states, tokens, lengths, sampled = _two_pending_rows(np.uint64 if fault == "id past int64" else np.int64)
    if fault == "id past int64":
        tokens[1, 40] = np.uint64(2 ** 64 - 1)
        sampled[1] = [2 ** 64 - 1]
    elif fault == "no candidate":
        states[1].candidate = None
    else:
        tokens[1] = tokens[0]
        sampled[1] = sampled[0]
        states[1] = states[0] if fault == "one state twice" else _core.DraftState(states[0].index)
        if fault == "one index twice":
            states[1].proposed, states[1].candidate = 3, (ROW, 1, 1, 3)
    outcomes = []
    with pytest.raises(ValueError, match="rows|candidate|earlier row"):
        _core.draft_rows(states, tokens, 64, lengths, sampled, 5, 1000, outcomes, False, ())
    assert _unchanged(states) and outcomes == []
    states[1] = _two_pending_rows()[0][1]  # (a fit row in its place: the marks were cleared)
    tokens[1] = _two_pending_rows()[1][1]
    sampled[1] = _two_pending_rows()[3][1]
    assert type(_core.draft_rows(states, tokens, 64, lengths, sampled, 5, 1000, outcomes, False, ())) is tuple


def test_a_length_past_int64_is_a_row_to_match_in_full_not_an_error():
    states, tokens, _, sampled = _two_pending_rows()
    lengths = np.array([41, 2 ** 64 - 1], np.uint64)
    assert _core.draft_rows(states, tokens, 64, lengths, sampled, 5, 1000, [], False, ()) == [1]
    assert _unchanged(states)


def test_send_drafts_cuts_to_the_chosen_lengths_and_leaves_the_states_waiting():
    a, b = _state([1, 2]), _state([3])
    out = _core.send_drafts([a, b, None], [[5, 6, 7], [8], None], [(ROW, 1, 1, 3), (ROW, 2, 1, 1), None],
                            [(2, 1.25), (1, 1), (0, 0.0)])
    assert out == [[5, 6], [8], []]
    assert (a.proposed, a.predicted, a.candidate) == (2, 1.25, (ROW, 1, 1, 3))
    assert (b.proposed, b.predicted, b.candidate) == (1, 1.0, (ROW, 2, 1, 1))


@pytest.mark.parametrize("chosen, error", [
    ([(4, 1.0)], ValueError),  # longer than the draft
    ([(-1, 1.0)], ValueError),
    ([(1, "x")], TypeError),
    ([(1.0, 1.0)], TypeError),
    ([[1, 1.0]], TypeError),
    ([(1, 10 ** 400)], ValueError),  # no double (named, not a bare OverflowError)
    ([], ValueError),
])
def test_send_drafts_checks_every_row_before_changing_a_state(chosen, error):
    a = _state([1])
    with pytest.raises(error):
        _core.send_drafts([a], [[5, 6, 7]], [(ROW, 1, 1, 3)], chosen)
    assert a.proposed == 0 and a.candidate is None
    with pytest.raises(ValueError):  # a row with a length needs a state and a candidate
        _core.send_drafts([None], [[5]], [(ROW, 1, 1, 1)], [(1, 1.0)])
    with pytest.raises(ValueError):
        _core.send_drafts([a], [[5]], [None], [(1, 1.0)])
    with pytest.raises(TypeError):
        _core.send_drafts((a,), [[5]], [None], [(1, 1.0)])


@pytest.mark.parametrize("value", [(0, 1, 1), (0, 1, 1, 2.0), [0, 1, 1, 2], (0, 1, 1, -2), (0, 1, 1, 1 << 40), 5])
def test_a_candidate_is_none_or_four_small_ints(value):
    state = _state([1])
    with pytest.raises(TypeError):
        state.candidate = value
    with pytest.raises(TypeError):
        del state.candidate
    state.candidate = (0, 1, 2, 3)
    assert state.candidate == (0, 1, 2, 3)


def test_the_c_step_s_constants_are_pld_s():
    assert _core.DRAFT_BUCKETS == (ROW, NGRAM_BUCKETS, SUPPORT_BUCKETS)
    assert (HEAD, TAIL, WINDOW) == _core.DRAFT_CHECK


def test_a_failure_inside_the_c_step_costs_a_step_its_drafts(caplog, monkeypatch):
    tokens = np.zeros((1, 100), dtype=np.int32)
    tokens[0, :30] = [i % 6 for i in range(30)]
    drafter = Drafter(config(k=4, max_model_len=100, adaptive=False))
    assert drafter.propose([[5]], np.array([30]), tokens) == [[0, 1, 2, 3]]

    def broken(*args):
        raise MemoryError("planted")

    monkeypatch.setattr(pld.vllm._core, "draft_rows", broken)
    with caplog.at_level(logging.ERROR, logger="pld"):
        assert drafter.propose([[5]], np.array([30]), tokens) == [[]]
    assert "drafting failed" in caplog.text and drafter.num_requests == 0
    monkeypatch.undo()
    assert drafter.propose([[5]], np.array([30]), tokens) == [[0, 1, 2, 3]]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_c_step_leaves_the_garbage_collector_as_it_found_it(enabled):
    """It holds the collector off while it reads the caller's lists (a
    finalizer could change one), and gives it back, also on an error."""
    import gc

    seq = list(range(20))
    state = _state(seq[:19])
    rows = np.array([seq + [0] * 4], np.int32)
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        out = _core.draft_rows([state], rows, 24, np.array([20]), [[19]], 4, 100, None, False, ())
        assert type(out) is tuple and gc.isenabled() is enabled
        with pytest.raises(TypeError):
            _core.draft_rows([object()], rows, 24, np.array([20]), [[19]], 4, 100, None, False, ())
        assert gc.isenabled() is enabled
        _core.send_drafts([state], [[1, 2]], [(ROW, 1, 1, 2)], [(1, 0.5)])
        with pytest.raises(ValueError):
            _core.send_drafts([state], [[1, 2]], [(ROW, 1, 1, 2)], [(3, 0.5)])
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_python_code_run_by_an_argument_s_conversion_cannot_pull_the_lists_from_under_the_step():
    """k's __index__ runs before any list is read: here it empties both
    lists, and the step sees them empty (no row, nothing read past them)."""
    seq = list(range(20))
    state = _state(seq)
    states, sampled = [state], [[19]]

    class Sneaky:
        def __index__(self):
            states.clear()
            sampled.clear()
            return 4

    out = _core.draft_rows(states, np.array([seq + [0] * 4], np.int32), 24, np.array([20]), sampled, Sneaky(),
                           100, None, False, ())
    assert out == ([], [], [], 0, True, None) and state.n == 20

    class Growing:
        def __index__(self):
            sampled.append([1])  # now longer than the states
            return 4

    states[:], sampled[:] = [state], [[19]]
    with pytest.raises(TypeError, match="one length"):
        _core.draft_rows(states, np.array([seq + [0] * 4], np.int32), 24, np.array([20]), sampled, Growing(),
                         100, None, False, ())
