"""pld.vllm.Drafter driven the way vLLM's runner drives it, without vLLM:
a fake input batch (a [rows, max_model_len] token array and the rows'
lengths) that adds, condenses, swaps, preempts, resumes and forks requests,
and prefills in chunks. Every draft is compared with a brute-force
reference that knows each row's request and looks the draft up in its
tokens alone (tests/reference.py: the newest VOTERS valid occurrences of
the longest suffix n-gram that has one vote on it, the index's "recent"
policy with voters). No torch: these run under the sanitizers too.
"""
from __future__ import annotations

import gc
import logging
import os
import random
import stat
import time
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pld
from pld import _core
from pld.corpus import Corpus
from pld.vllm import HEAD, MULTI_RANK_VERIFY_COST, VOTERS, WINDOW, Drafter, best_chain

from reference import _lookup

VOCAB = 50


def config(k=4, max_model_len=400, max_num_seqs=8, vocab=VOCAB, tensor_parallel_size=1, **pld_options):
    model = types.SimpleNamespace(max_model_len=max_model_len, get_vocab_size=lambda: vocab,
                                  hf_config=types.SimpleNamespace(bos_token_id=1, eos_token_id=2, pad_token_id=None))
    return types.SimpleNamespace(
        speculative_config=types.SimpleNamespace(num_speculative_tokens=k),
        model_config=model, scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=1),
        additional_config={"pld": pld_options} if pld_options is not None else {})


class FakeBatch:
    """vLLM's input batch as the drafter sees it: rows packed from 0, each
    holding a request's tokens; requests carry ids the drafter never sees."""

    def __init__(self, rows: int, max_len: int, rng: random.Random, vocab: int) -> None:
        self.tokens = np.zeros((rows, max_len), dtype=np.int32)
        self.lengths = np.zeros(rows, dtype=np.int32)
        self.max_len, self.rng, self.vocab = max_len, rng, vocab
        self.order: list = []  # request id per row
        self.seqs: dict = {}  # request id -> tokens
        self.prefilling: dict = {}  # request id -> steps of prefill left
        self.drafts: dict = {}  # request id -> its last draft
        self.next_id = 0

    def _write(self, row: int, rid: int) -> None:
        seq = self.seqs[rid]
        self.tokens[row, :] = -7  # stale content a real batch may leave behind
        self.tokens[row, :len(seq)] = seq
        self.lengths[row] = len(seq)

    def add(self, prompt, chunks: int = 0, rid=None) -> int:
        if rid is None:
            rid, self.next_id = self.next_id, self.next_id + 1
            self.seqs[rid] = list(prompt)
        self.order.append(rid)
        self.prefilling[rid] = chunks
        self._write(len(self.order) - 1, rid)
        return rid

    def remove(self, rid: int) -> None:
        """Finish or preempt: the last row moves into the hole (condense)."""
        row = self.order.index(rid)
        last = self.order.pop()
        if last != rid:
            self.order[row] = last
            self._write(row, last)
        self.drafts.pop(rid, None)

    def swap(self, i: int, j: int) -> None:
        self.order[i], self.order[j] = self.order[j], self.order[i]
        self._write(i, self.order[i])
        self._write(j, self.order[j])

    def step(self) -> list:
        """Accept part of each row's last draft plus one token; the rows'
        sampled tokens (empty while a prefill runs)."""
        sampled = []
        for row, rid in enumerate(self.order):
            if self.prefilling[rid] > 0:
                self.prefilling[rid] -= 1
                sampled.append([])
                continue
            seq, draft = self.seqs[rid], self.drafts.get(rid, [])
            room = self.max_len - len(seq)
            if room <= 0:
                sampled.append([])
                continue
            keep = self.rng.randint(0, len(draft))
            new = (draft[:keep] + [self._next(seq)])[:room]
            seq.extend(new)
            self.tokens[row, len(seq) - len(new):len(seq)] = new
            self.lengths[row] = len(seq)
            sampled.append(new)
        return sampled

    def _next(self, seq) -> int:
        if len(seq) > 4 and self.rng.random() < 0.7:  # copy what followed an earlier token
            i = self.rng.randrange(len(seq) - 1)
            return seq[i + 1]
        return self.rng.randrange(self.vocab)

    def reference(self, sampled, k: int, max_n: int = 3, min_n: int = 1, voters: int = VOTERS) -> list:
        out = []
        for rid, new in zip(self.order, sampled):
            seq = self.seqs[rid]
            want = min(k, self.max_len - len(seq))
            out.append(_lookup(seq, max_n, want, min_n, "seed", None, (), pick_latest=True, voters=voters)
                       if new and want > 0 else [])
        return out


def drive(drafter: Drafter, batch: FakeBatch, sampled: list, k: int) -> list:
    drafts = drafter.propose(sampled, batch.lengths, batch.tokens)
    assert len(drafts) == len(sampled)
    for rid, draft in zip(batch.order, drafts):
        batch.drafts[rid] = list(draft)
    assert drafts == batch.reference(sampled, k, voters=drafter.options.voters)
    return drafts


def random_events(batch: FakeBatch, rng: random.Random, rows: int, vocab: int) -> None:
    live = list(batch.order)
    roll = rng.random()
    if roll < 0.25 and len(batch.order) < rows:
        if live and rng.random() < 0.3:  # n > 1: another sample of a running prompt
            src = batch.seqs[rng.choice(live)]
            batch.add(src[:rng.randint(1, len(src))], chunks=rng.randint(0, 2))
        else:
            batch.add([rng.randrange(vocab) for _ in range(rng.randint(1, 40))], chunks=rng.randint(0, 2))
    elif roll < 0.35 and live:
        batch.remove(rng.choice(live))
    elif roll < 0.45 and len(live) >= 2:
        batch.swap(*rng.sample(range(len(live)), 2))
    elif roll < 0.5 and live and len(batch.order) <= rows:  # preempt now, resume later
        rid = rng.choice(live)
        batch.remove(rid)
        batch.preempted = getattr(batch, "preempted", []) + [rid]
    elif roll < 0.6 and getattr(batch, "preempted", None) and len(batch.order) < rows:
        batch.add(None, chunks=rng.randint(0, 1), rid=batch.preempted.pop(0))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 8), k=st.integers(1, 6),
       voters=st.sampled_from([VOTERS, VOTERS, 1, 3]))
def test_drafts_equal_a_reference_that_knows_each_rows_request(seed, vocab, k, voters):
    """Rows added, finished (condensed), swapped, preempted and resumed,
    forked (n > 1), prefilled in chunks, over tiny vocabularies where
    requests look alike: each draft is the one the row's own request gives."""
    rng = random.Random(seed)
    rows = 5
    batch = FakeBatch(rows, 200, rng, vocab)
    drafter = Drafter(config(k=k, max_model_len=200, max_num_seqs=rows, adaptive=False, voters=voters))
    for _ in range(60):
        random_events(batch, rng, rows, vocab)
        drive(drafter, batch, batch.step(), k)
    assert drafter.num_requests <= 2 * rows  # in a row, or in the pool


def test_a_request_resumed_after_preemption_keeps_its_index():
    rng = random.Random(1)
    batch = FakeBatch(4, 300, rng, 20)
    drafter = Drafter(config(k=5, max_model_len=300, adaptive=False))
    a = batch.add([rng.randrange(20) for _ in range(60)])
    batch.add([rng.randrange(20) for _ in range(60)])
    for _ in range(5):
        drive(drafter, batch, batch.step(), 5)
    held = {id(s): s for s in drafter.rows.values()}
    batch.remove(a)
    drive(drafter, batch, batch.step(), 5)
    assert len(drafter.pool) == 1
    batch.add(None, chunks=1, rid=a)
    for _ in range(3):
        drive(drafter, batch, batch.step(), 5)
    assert {id(s) for s in drafter.rows.values()} == set(held)  # the same states, no rebuild
    assert not drafter.pool


def test_memory_is_bounded_by_the_rows_and_the_pool():
    rng = random.Random(2)
    batch = FakeBatch(3, 120, rng, 30)
    drafter = Drafter(config(k=3, max_model_len=120, max_num_seqs=3, adaptive=False))
    for i in range(40):
        if len(batch.order) == 3:
            batch.remove(batch.order[rng.randrange(3)])
        batch.add([rng.randrange(30) for _ in range(20)])
        drive(drafter, batch, batch.step(), 3)
    assert len(drafter.pool) <= 3
    assert drafter.num_requests <= 6


def test_a_look_alike_request_is_caught_by_the_rolling_check():
    """Two long requests equal in their head and their latest tokens and
    different in the middle: the row's new request is told apart within
    the steps the rolling window needs to cover the context."""
    n = 4 * WINDOW
    a = [i % 7 for i in range(n)]
    b = list(a)
    b[n // 2] = 9
    tokens = np.zeros((1, n + 64), dtype=np.int32)
    drafter = Drafter(config(k=4, max_model_len=n + 64, adaptive=False))
    tokens[0, :n] = a
    drafter.propose([[a[-1]]], np.array([n]), tokens)
    first = next(iter(drafter.rows.values()))
    tokens[0, :n] = b  # another request takes the row, as long
    for step in range(n // WINDOW + 1):
        drafter.propose([[b[-1]]], np.array([n]), tokens)
        if next(iter(drafter.rows.values())) is not first:
            break
    else:
        pytest.fail("the look-alike request was never told apart")
    assert drafter.rows[0].index.tokens()[:n] == b


def _periodic_row():
    """A row of 4 * WINDOW tokens (0..6 repeating) in a token array with
    room after it, and a drafter for it: (n, tokens as a list, the array,
    the drafter)."""
    n = 4 * WINDOW
    a = [i % 7 for i in range(n)]
    tokens = np.zeros((1, n + 64), dtype=np.int32)
    tokens[0, :n] = a
    return n, a, tokens, Drafter(config(k=4, max_model_len=n + 64, adaptive=False))


@pytest.mark.parametrize("where", [0, HEAD - 1, 4 * WINDOW - 2], ids=["head", "end-of-head", "tail"])
def test_a_request_differing_in_its_head_or_tail_is_told_apart_at_once(where):
    """The head and tail are checked every step, whichever window the
    rolling check is at (here [WINDOW, 2 * WINDOW), away from both)."""
    n, a, tokens, drafter = _periodic_row()
    drafter.propose([[a[-1]]], np.array([n]), tokens)
    drafter.propose([[a[-1]]], np.array([n]), tokens)  # the rolling check covered [0, WINDOW)
    first = drafter.rows[0]
    b = list(a)
    b[where] = 9
    tokens[0, :n] = b  # another request takes the row, as long
    drafter.propose([[b[-1]]], np.array([n]), tokens)
    assert drafter.rows[0] is not first
    assert drafter.rows[0].index.tokens()[:n] == b


def test_the_rolling_window_moves_on_once_the_head_and_tail_match():
    n, a, tokens, drafter = _periodic_row()
    drafter.propose([[a[-1]]], np.array([n]), tokens)
    state = drafter.rows[0]
    assert state.seems(tokens, 0, n) and state.cursor == WINDOW
    tokens[0, 0] = 9  # the head differs: the window stays
    assert not state.seems(tokens, 0, n) and state.cursor == WINDOW
    tokens[0, 0] = a[0]
    tokens[0, WINDOW + 1] = 9  # the next window differs: it is checked, and passed
    assert not state.seems(tokens, 0, n) and state.cursor == 2 * WINDOW
    assert state.seems(tokens, 0, n) and state.cursor == 3 * WINDOW
    assert state.seems(tokens, 0, n) and state.cursor == 4 * WINDOW
    assert state.seems(tokens, 0, n) and state.cursor == WINDOW  # round again, from 0
    assert not state.seems(tokens, 0, n) and state.cursor == 2 * WINDOW
    assert state.seems(tokens, 0, WINDOW // 2) and state.cursor == WINDOW // 2  # a shorter row: its end


def test_a_new_request_in_a_finished_ones_row_is_not_served_its_index():
    tokens = np.zeros((1, 100), dtype=np.int32)
    drafter = Drafter(config(k=4, max_model_len=100, adaptive=False))
    tokens[0, :12] = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8]
    assert drafter.propose([[8]], np.array([12]), tokens) == [[5, 6, 7, 8]]
    tokens[0, :12] = [5, 6, 7, 9, 9, 9, 9, 9, 9, 9, 9, 8]  # same head token, last token too
    assert drafter.propose([[8]], np.array([12]), tokens) == [[]]


def test_two_drafters_fed_the_same_steps_draft_the_same():
    """What every tensor-parallel rank does: same inputs, same drafts
    (adaptive lengths and a learning corpus included). On several ranks
    the cost is fixed, and no clock is read."""
    drafts = []
    for _ in range(2):
        rng = random.Random(7)
        batch = FakeBatch(4, 300, rng, 12)
        drafter = Drafter(config(k=6, max_model_len=300, max_num_seqs=4, learn=True, tensor_parallel_size=2))
        assert drafter.options.verify_cost == MULTI_RANK_VERIFY_COST
        drafter.budget.clock = None  # (a call would raise)
        seen = []
        for _ in range(80):
            random_events(batch, rng, 4, 12)
            out = drafter.propose(batch.step(), batch.lengths, batch.tokens)
            for rid, draft in zip(batch.order, out):
                batch.drafts[rid] = draft
            seen.append(out)
        drafts.append(seen)
    assert drafts[0] == drafts[1]
    assert any(d for step in drafts[0] for d in step)


def test_per_request_lengths_draft_less_where_drafts_fail():
    tokens = np.zeros((1, 400), dtype=np.int32)
    seq = [3, 4, 5, 6] * 10
    tokens[0, :len(seq)] = seq
    drafter = Drafter(config(k=8, max_model_len=400, adaptive="request"))
    sizes = []
    for step in range(12):  # every draft rejected: the next token is new
        draft = drafter.propose([[seq[-1]]], np.array([len(seq)]), tokens)[0]
        sizes.append(len(draft))
        seq.append(40 + step)
        tokens[0, len(seq) - 1] = seq[-1]
    assert sizes[0] == 8
    assert sizes.count(0) >= 4  # pauses after rejections
    assert max(sizes[1:]) < 8


def test_a_request_s_tables_grow_at_its_first_step_not_while_it_decodes_as_long_as_its_context():
    rng = random.Random(5)
    n = 300
    tokens = np.array([[rng.randrange(1000) for _ in range(2 * n + 8)]], dtype=np.int32)
    drafter = Drafter(config(k=4, max_model_len=4 * n, adaptive=False))
    drafter.propose([[int(tokens[0, n - 1])]], np.array([n]), tokens)
    state = drafter.rows[0]
    size = state.index.nbytes
    for m in range(n + 1, 2 * n + 1):  # as many tokens again, one a step
        drafter.propose([[int(tokens[0, m - 1])]], np.array([m]), tokens)
    assert drafter.rows[0] is state and len(state.index) == 2 * n and state.index.nbytes == size


def test_drafts_accepted_whole_file_the_next_chain_as_a_copy_under_way():
    # the budget learns chains after whole accepts apart (support bucket 1 + those in a row, <= 3): streaks
    text = [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1]
    tokens = np.zeros((1, 64), dtype=np.int32)
    tokens[0, :len(text)] = text
    drafter = Drafter(config(k=4, max_model_len=64, verify_cost=0.0))  # every token pays
    n = len(text)
    assert drafter.propose([[1]], np.array([n]), tokens) == [[2, 3, 4, 5]]
    state = drafter.rows[0]
    assert state.candidate[2] == 1  # nothing accepted yet
    tokens[0, n:n + 5] = [2, 3, 4, 5, 6]  # all 4 accepted, then the model's token
    n += 5
    assert drafter.propose([[2, 3, 4, 5, 6]], np.array([n]), tokens) == [[7, 8, 9, 1]]
    assert state.candidate[2] == 2
    tokens[0, n:n + 5] = [7, 8, 9, 1, 2]  # all 4 again
    n += 5
    assert drafter.propose([[7, 8, 9, 1, 2]], np.array([n]), tokens) == [[3, 4, 5, 6]]
    assert state.candidate[2] == 3
    tokens[0, n:n + 5] = [3, 4, 5, 6, 7]  # and again: the bucket stays at 3
    n += 5
    drafter.propose([[3, 4, 5, 6, 7]], np.array([n]), tokens)
    assert state.candidate[2] == 3
    tokens[0, n:n + 2] = [8, 3]  # 1 of 4 accepted
    n += 2
    drafter.propose([[7, 3]], np.array([n]), tokens)
    assert state.candidate[2] == 1


def test_the_corpus_drafts_where_the_row_has_no_match_and_learns_outputs(tmp_path):
    drafter = Drafter(config(k=4, max_model_len=100, adaptive=False, learn=True))
    tokens = np.zeros((2, 100), dtype=np.int32)
    done = [11, 12, 13, 14, 15, 16, 17]  # the output; the prompt is [20, 10]
    tokens[0, :9] = [20, 10] + done
    drafter.propose([done], np.array([9]), tokens)
    drafter.propose([], np.array([], dtype=np.int32), tokens)  # the request finished
    assert drafter.corpus.sequences() == [done]
    tokens[1, :3] = [30, 11, 12]  # no match in the row itself
    assert drafter.propose([[], [12]], np.array([0, 3]), tokens) == [[], [13, 14, 15, 16]]


def test_the_corpus_is_saved_at_close_and_loaded_at_start(tmp_path):
    path = str(tmp_path / "c.pldc")
    drafter = Drafter(config(k=4, adaptive=False, save_corpus=path))
    tokens = np.zeros((1, 400), dtype=np.int32)
    tokens[0, :6] = [1, 7, 8, 9, 10, 11]
    drafter.propose([[11]], np.array([6]), tokens)
    drafter.propose([], np.array([], dtype=np.int32), tokens)
    assert os.path.isfile(path)  # saved once it learned, before any close
    drafter.close()
    loaded = Drafter(config(k=4, corpus=path))
    assert loaded.corpus.sequences() == [[11]]
    assert loaded.options.learn


def test_a_corpus_that_is_also_the_save_path_starts_empty_on_a_first_run(tmp_path):
    """``corpus`` and ``save_corpus`` the same path (load at start, save as
    it learns): on the first run the file is not there yet, and the drafter
    starts with an empty corpus and writes it; the next run loads it. A
    missing corpus that is not the save path is still refused."""
    path = str(tmp_path / "c.pldc")
    drafter = Drafter(config(k=4, adaptive=False, corpus=path, save_corpus=path))
    assert drafter.options.learn and len(drafter.corpus) == 0
    tokens = np.zeros((1, 400), dtype=np.int32)
    tokens[0, :6] = [1, 7, 8, 9, 10, 11]
    drafter.propose([[11]], np.array([6]), tokens)
    drafter.close()
    again = Drafter(config(k=4, corpus=path, save_corpus=path))
    assert again.corpus.sequences() == [[11]]
    with pytest.raises(ValueError, match="corpus.*no such file"):
        Drafter(config(k=4, corpus=str(tmp_path / "other.pldc"), save_corpus=path))


def _run(drafter, tokens, steps, row=0):
    """Row ``row`` (a one-row batch) takes each step's sampled ids in turn."""
    n = int(np.count_nonzero(tokens[row] != 0))
    for sampled in steps:
        tokens[row, n:n + len(sampled)] = sampled
        n += len(sampled)
        drafter.propose([sampled], np.array([n]), tokens)
    return n


def test_a_request_that_samples_its_end_of_sequence_id_is_learned_at_that_step():
    """vLLM says nothing when a request ends; the step whose sampled ids
    hold the model's EOS (2 here) learns its output at once (not at a later
    request's step, which may never come), and the step that finds the row
    gone offers nothing twice. In the C step (rows as last seen) and in
    Python's (a new row beside it)."""
    drafter = Drafter(config(k=4, adaptive=False, learn=True))
    assert drafter._stop == (2,)
    tokens = np.zeros((2, 400), dtype=np.int32)
    tokens[0, :2] = [20, 10]
    _run(drafter, tokens, [[11], [12, 13]])
    assert drafter.corpus.sequences() == []
    _run(drafter, tokens, [[14, 2]])  # (the C step: the row is the request last seen)
    assert drafter.corpus.sequences() == [[11, 12, 13, 14, 2]]
    drafter.propose([], np.array([], dtype=np.int32), tokens)  # gone
    assert drafter.corpus.sequences() == [[11, 12, 13, 14, 2]]
    tokens[:] = 0
    tokens[0, :4] = [30, 31, 15, 16]
    drafter.propose([[16]], np.array([4]), tokens)
    tokens[0, 4:6] = [17, 2]
    tokens[1, :3] = [40, 41, 42]  # a new request: this step runs in Python
    drafter.propose([[17, 2], [42]], np.array([6, 3]), tokens)
    assert drafter.corpus.sequences()[-1] == [16, 17, 2]
    drafter.propose([[42]], np.array([3]), tokens[1:])  # row 0 gone, row 1 moved up
    assert len(drafter.corpus.sequences()) == 2


def test_the_ids_that_end_a_request_come_from_the_model_s_configs():
    """Its EOS ids (an int or a list), then its generation config's: each
    once, within the vocabulary; a value that is no ids gives none."""
    from pld.vllm import _stop_ids

    model = types.SimpleNamespace(get_vocab_size=lambda: VOCAB, hf_text_config=None,
                                  hf_config=types.SimpleNamespace(eos_token_id=[2, 5, 2, VOCAB + 1, -1]),
                                  try_get_generation_config=lambda: {"eos_token_id": np.int64(7)})
    assert _stop_ids(model) == (2, 5, 7)
    model.hf_config.eos_token_id = "2"
    model.try_get_generation_config = lambda: 1 / 0  # (unreadable)
    assert _stop_ids(model) == ()
    model.hf_config.eos_token_id = list(range(40))
    assert _stop_ids(model) == tuple(range(_core.DRAFT_STOP_MAX))


def test_a_request_going_on_after_its_end_of_sequence_id_is_learned_in_pieces():
    """(vLLM's ignore_eos): each piece once, up to its EOS (the ids a step
    sampled after it are not learned: vLLM drops them unless it ignores
    EOS), the last when the row is gone."""
    drafter = Drafter(config(k=4, adaptive=False, learn=True))
    tokens = np.zeros((1, 400), dtype=np.int32)
    tokens[0, :2] = [20, 10]
    _run(drafter, tokens, [[11], [2], [12, 13], [2, 14], [15]])
    assert drafter.corpus.sequences() == [[11, 2], [12, 13, 2]]
    drafter.propose([], np.array([], dtype=np.int32), tokens)
    assert drafter.corpus.sequences() == [[11, 2], [12, 13, 2], [15]]


def test_a_request_repeating_the_prompt_in_its_row_learns_the_output_it_replaces():
    """A request that stopped without an EOS (max_tokens), and the same
    prompt again in its row: the row has not grown by the ids sampled
    since, so it is another request, with an index of its own; the first
    one's output is learned as it leaves its row, the new one's later."""
    drafter = Drafter(config(k=4, adaptive=False, learn=True))
    prompt = [20, 21, 22, 23]
    tokens = np.zeros((1, 400), dtype=np.int32)
    tokens[0, :4] = prompt
    _run(drafter, tokens, [[11], [12], [13]])
    first = drafter.rows[0]
    tokens[0, :] = 0
    tokens[0, :4] = prompt
    _run(drafter, tokens, [[11]])  # greedy: the same first token
    assert drafter.rows[0] is not first and drafter.rows[0].n == 5
    assert drafter.corpus.sequences() == [[11, 12, 13]]
    _run(drafter, tokens, [[14, 2]])
    assert drafter.corpus.sequences() == [[11, 12, 13], [11, 14, 2]]


@pytest.mark.parametrize("python_path", [False, True])
@pytest.mark.parametrize("delta", [-4, -1, 1])
def test_a_look_alike_taking_a_finished_requests_row_never_drafts_its_ids(python_path, delta):
    """Request B takes the row request A finished in: the same template,
    head and tail, A's private ids in the middle (where the rolling window
    is not), and B's row ``delta`` ids off what A's plus one sampled id
    would be (shorter than A's state, as long, longer). Only a row grown by
    exactly the ids sampled is taken for the request last seen there; B is
    matched in full and drafts from its own ids, on the C step and on the
    Python step alike."""
    rng = np.random.default_rng(1)
    template = rng.integers(100, 1000, 1000)
    template[600:603] = [11, 12, 13]
    template[-2:] = [11, 12]
    a, b = template.copy(), template.copy()
    a[603:607] = [777, 778, 779, 780]
    b[603:607] = [555, 556, 557, 558]
    drafter = Drafter(config(k=4, max_model_len=4000, vocab=1000, adaptive=False))
    if python_path:
        drafter.propose = types.MethodType(lambda self, s, n, t: self._step(s, n, self._readable(t), None), drafter)
    tokens = np.zeros((1, 4000), dtype=np.int32)
    seq_a = list(a) + [13, 20, 21, 22]
    for n in range(1001, 1005):  # A decodes 4 steps
        tokens[0, :n] = seq_a[:n]
        drafter.propose([[seq_a[n - 1]]], np.array([n]), tokens)
    n = 1004 + 1 + delta
    seq_b = (list(b) + seq_a[1000:] + [23, 30, 31])[:n]
    tokens[0, :] = 0
    tokens[0, :n] = seq_b
    draft = drafter.propose([[seq_b[-1]]], np.array([n]), tokens)[0]
    assert not set(draft) & {777, 778, 779, 780}
    assert draft == _lookup(seq_b, 3, 4, 1, "seed", None, (), pick_latest=True, voters=VOTERS)
    assert draft == [555, 556, 557, 558] or delta != -4


def test_the_corpus_is_saved_within_save_every_of_learning_with_no_step_after(tmp_path):
    """vLLM may kill the drafter's process with no notice (vllm serve kills
    its workers): what it learned is written within ``save_every`` seconds
    by a timer, whether or not another step comes."""
    path = str(tmp_path / "c.pldc")
    drafter = Drafter(config(k=4, adaptive=False, save_corpus=path, save_every=0.2))
    tokens = np.zeros((1, 400), dtype=np.int32)
    tokens[0, :2] = [20, 10]
    _run(drafter, tokens, [[11, 2]])
    assert Corpus.load(path).sequences() == [[11, 2]]  # the first save: at once
    _run(drafter, tokens, [[12, 2]])  # learned within save_every of it: saved later
    deadline = time.monotonic() + 30
    while Corpus.load(path).sequences() != [[11, 2], [12, 2]]:
        assert time.monotonic() < deadline, "the corpus was not saved after save_every"
        time.sleep(0.05)
    assert drafter._timer is None


def test_a_save_every_beyond_what_a_thread_can_wait_is_a_wait_without_end(tmp_path):
    """(threading.Timer raises in its own thread past threading.TIMEOUT_MAX, about 292 years.)"""
    path = str(tmp_path / "c.pldc")
    drafter = Drafter(config(k=4, adaptive=False, save_corpus=path, save_every=1e300))
    tokens = np.zeros((1, 400), dtype=np.int32)
    tokens[0, :2] = [20, 10]
    _run(drafter, tokens, [[11, 2], [12, 2]])
    time.sleep(0.2)
    assert drafter._timer is not None and drafter._timer.is_alive()
    drafter.close()
    assert drafter._timer is None and Corpus.load(path).sequences() == [[11, 2], [12, 2]]


@pytest.mark.parametrize("tensor, rank, engine, writes", [
    (1, 0, 0, "c.pldc"), (2, 0, 0, "c.pldc"), (2, 1, 0, None), (2, 2, 0, "c.pldc"), (4, 5, 0, None),
    (1, 0, 1, "c.pldc.dp1"), (2, 2, 3, "c.pldc.dp3"), (2, 3, 3, None)])
def test_one_rank_of_each_data_parallel_engine_writes_its_corpus(tmp_path, tensor, rank, engine, writes):
    """Tensor-parallel ranks learn the same, so rank 0 of each stage
    alone writes (a stage that never drafts learns nothing, and writes
    nothing); data-parallel engines learn their own requests, so engine i
    writes its own file."""
    cfg = config(k=4, adaptive=False, save_corpus=str(tmp_path / "c.pldc"), tensor_parallel_size=tensor)
    cfg.parallel_config.rank, cfg.parallel_config.data_parallel_index = rank, engine
    drafter = Drafter(cfg)
    tokens = np.zeros((1, 400), dtype=np.int32)
    tokens[0, :2] = [20, 10]
    _run(drafter, tokens, [[11, 2]])
    drafter.close()
    assert sorted(os.listdir(tmp_path)) == ([writes] if writes else [])
    assert drafter.corpus.sequences() == [[11, 2]]  # (every rank learns: its drafts are the same)


def test_a_drafter_that_learned_nothing_writes_nothing(tmp_path):
    """(Not even at close: the file it would overwrite may be another
    engine's, or the one it loaded; a pipeline stage that never drafts
    sees no step.)"""
    path = tmp_path / "c.pldc"
    drafter = Drafter(config(k=4, adaptive=False, save_corpus=str(path)))
    tokens = np.zeros((1, 400), dtype=np.int32)
    tokens[0, :3] = [20, 10, 11]
    drafter.propose([[]], np.array([3]), tokens)  # (a prefill: nothing sampled, nothing held)
    drafter.close()
    assert not path.exists()


def test_closing_learns_the_requests_still_in_rows(tmp_path):
    """A request cut by max_tokens, the last to run: at close (an engine
    that exits normally) its output is learned, then saved."""
    path = str(tmp_path / "c.pldc")
    drafter = Drafter(config(k=4, adaptive=False, save_corpus=path, save_every=3600))
    tokens = np.zeros((1, 400), dtype=np.int32)
    tokens[0, :2] = [20, 10]
    _run(drafter, tokens, [[11], [12, 13]])
    drafter.close()
    assert Corpus.load(path).sequences() == [[11, 12, 13]]


def test_a_drafter_vllm_drops_learns_and_saves_as_it_goes(tmp_path):
    """vLLM's worker drops its drafter before the process exits (so an
    atexit hook finds it gone): the requests still in rows are learned,
    and a save that waited on the timer is written, as it goes."""
    path = str(tmp_path / "c.pldc")
    drafter = Drafter(config(k=4, adaptive=False, save_corpus=path, save_every=3600))
    tokens = np.zeros((1, 400), dtype=np.int32)
    tokens[0, :2] = [20, 10]
    _run(drafter, tokens, [[11], [12, 13]])  # cut by max_tokens: no EOS
    del drafter
    gc.collect()
    assert Corpus.load(path).sequences() == [[11, 12, 13]]

    path = str(tmp_path / "d.pldc")
    drafter = Drafter(config(k=4, adaptive=False, save_corpus=path, save_every=3600))
    _run(drafter, tokens, [[11, 2], [12, 2]])  # the first saved at once, the second waits on the timer
    assert Corpus.load(path).sequences() == [[11, 2]]
    del drafter
    gc.collect()
    assert Corpus.load(path).sequences() == [[11, 2], [12, 2]]


def test_best_chain_follows_the_most_supported_child():
    # root -> 5 (support 1) / 6 (support 3); 6 -> 7 (2) / 8 (2): first on ties
    assert best_chain([5, 6, 7, 8], [-1, -1, 1, 1], [1, 1, 2, 2], [2, 2, 2, 2], [1, 3, 2, 2]).tokens == [6, 7]
    assert best_chain([], [], [], [], []).tokens == []


@pytest.mark.parametrize("k, options, message", [
    (0, {}, "num_speculative_tokens"),
    (_core.MAX_DRAFT + 1, {}, "num_speculative_tokens"),
    (4, {"prompt_lookup_min": 0}, "prompt_lookup_min"),
    (4, {"prompt_lookup_max": _core.MAX_NGRAM + 1}, "prompt_lookup_max"),
    (4, {"prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_min"),
    (4, {"prompt_lookup_max": "3"}, "prompt_lookup_max"),
    (4, {"voters": 0}, "voters"),
    (4, {"voters": _core.MAX_VOTERS + 1}, "voters"),
    (4, {"voters": "16"}, "voters"),
    (4, {"voters": True}, "voters"),
    (4, {"adaptive": 1}, "adaptive"),
    (4, {"adaptive": 1.0}, "adaptive"),
    (4, {"adaptive": "sometimes"}, "adaptive"),
    (4, {"ngram": 3}, "unknown option"),
    (4, {"corpus": "/nonexistent/c.pldc"}, "corpus"),
    (4, {"corpus": 5}, "corpus"),
    (4, {"save_every": -1}, "save_every"),
    (4, {"save_every": float("nan")}, "save_every"),
    (4, {"save_corpus": "/nonexistent/c.pldc"}, "save_corpus.*no such folder"),
    (4, {"save_corpus": "/"}, "save_corpus.*is a folder"),
    (4, {"save_corpus": ""}, "save_corpus"),
    (4, {"save_corpus": "/tmp/c\0.pldc"}, "save_corpus.*NUL"),
    (4, {"corpus": "c\0.pldc"}, "corpus.*NUL"),
    (4, {"verify_cost": 10 ** 400}, "verify_cost"),
    (4, {"save_every": 10 ** 400}, "save_every"),
    (4, {"verify_cost": np.array(["learned"])}, "verify_cost"),
    (4, {"corpus": "/"}, "corpus.*not a regular file"),
    (4, {"corpus": "/dev/null"}, "corpus.*not a regular file"),
])
def test_bad_options_are_refused_at_start(k, options, message):
    with pytest.raises((TypeError, ValueError), match=message):
        Drafter(config(k=k, **options))


def test_a_save_path_that_is_not_a_regular_file_is_refused_at_start(tmp_path):
    """A save replaces what is there (os.replace): a FIFO or a device in
    its place is refused when the engine starts, and by Corpus.save, and
    left as it was."""
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="save_corpus.*not a regular file"):
        Drafter(config(save_corpus=fifo))
    corpus = Corpus(1000)
    corpus.add([1, 2, 3])
    with pytest.raises(ValueError, match="pipe.*not a regular file"):
        corpus.save(fifo)
    with pytest.raises(ValueError, match="NUL"):
        corpus.save(str(tmp_path / "c\0.pldc"))
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ["pipe"]


def test_bad_corpus_files_are_refused_at_start(tmp_path, monkeypatch, caplog):
    bad = tmp_path / "bad.pldc"
    bad.write_bytes(b"PLDCORP\0garbage")
    with pytest.raises(ValueError, match="additional_config.*corpus.*bad.pldc"):
        Drafter(config(corpus=str(bad)))
    good = Corpus(1000)
    good.add([1, 2, 3])
    path = str(tmp_path / "good.pldc")
    good.save(path)

    def unreadable(*args, **kwargs):  # (what a mode-000 file gives a user other than root)
        raise PermissionError(13, "Permission denied", path)

    with monkeypatch.context() as patch:
        patch.setattr(Corpus, "load", unreadable)
        with pytest.raises(ValueError, match="additional_config.*corpus.*Permission denied"):
            Drafter(config(corpus=path))
    with caplog.at_level(logging.WARNING, logger="pld"):
        assert Drafter(config(corpus=path, corpus_max_tokens=50)).corpus.max_tokens == 1000
    assert "corpus_max_tokens (50) sizes a new corpus only" in caplog.text
    other = Corpus(1000)
    other.add([1, 2, VOCAB + 5])  # an id beyond this model's vocabulary
    path = str(tmp_path / "other.pldc")
    other.save(path)
    with pytest.raises(ValueError, match="other.pldc.*beyond"):
        Drafter(config(corpus=path))


def test_a_save_path_this_user_may_not_replace_is_refused_at_start(tmp_path, monkeypatch):
    """In a sticky folder (as /tmp) only a file's owner, the folder's or
    root may replace it: another's file there would fail every save."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    path = folder / "c.pldc"
    path.write_bytes(b"")
    owner = os.stat(path).st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # (another user than the file's and the folder's)
    with pytest.raises(ValueError, match="save_corpus.*belongs to another user"):
        Drafter(config(save_corpus=str(path)))
    folder.chmod(0o777)  # not sticky: anyone who may write there may replace it
    Drafter(config(save_corpus=str(path))).close()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    folder.chmod(0o1777)
    Drafter(config(save_corpus=str(path))).close()


def test_additional_config_must_be_a_dict():
    cfg = config()
    cfg.additional_config = {"pld": [1]}
    with pytest.raises(TypeError, match="additional_config"):
        Drafter(cfg)
    cfg.additional_config = {"pld": {1: 2, "ngram": 3}}  # (keys of two types: the Python API takes any)
    with pytest.raises(ValueError, match="unknown option.*'ngram'"):
        Drafter(cfg)


def test_no_draft_runs_past_max_model_len():
    tokens = np.zeros((1, 12), dtype=np.int32)
    tokens[0, :10] = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
    drafter = Drafter(config(k=6, max_model_len=12, adaptive=False))
    assert drafter.propose([[1]], np.array([10]), tokens) == [[2, 3]]
    tokens[0, 10:12] = [2, 3]
    assert drafter.propose([[2, 3]], np.array([12]), tokens) == [[]]


def test_head_keys_follow_short_requests():
    """A request first seen with fewer than HEAD tokens is found again
    once it is longer (after a move)."""
    tokens = np.zeros((2, 100), dtype=np.int32)
    drafter = Drafter(config(k=3, max_model_len=100, adaptive=False))
    seq = [4, 5, 6]
    tokens[0, :3] = seq
    drafter.propose([[6]], np.array([3]), tokens)
    state = drafter.rows[0]
    for t in range(HEAD + 4):
        seq.append(t % 5)
        tokens[0, len(seq) - 1] = seq[-1]
        drafter.propose([[seq[-1]]], np.array([len(seq)]), tokens)
    tokens[1, :len(seq)] = seq  # moved to row 1; a new request prefills in row 0
    tokens[0, :5] = [9, 9, 9, 9, 9]
    drafter.propose([[], [seq[-1]]], np.array([5, len(seq)]), tokens)
    assert drafter.rows[1] is state


def test_a_corpus_that_cannot_be_saved_warns_and_drafting_goes_on(tmp_path, caplog):
    folder = tmp_path / "gone"
    folder.mkdir()
    drafter = Drafter(config(k=4, adaptive=False, save_corpus=str(folder / "outputs.pldc")))
    folder.rmdir()  # (after the start's check: removed while serving)
    tokens = np.zeros((1, 400), dtype=np.int32)
    tokens[0, :9] = [1, 7, 8, 9, 10, 11, 12, 7, 8]
    with caplog.at_level(logging.WARNING, logger="pld"):
        assert drafter.propose([[8]], np.array([9]), tokens) == [[9, 10, 11, 12]]
        drafter.propose([], np.array([], dtype=np.int32), tokens)
    assert "could not save the corpus" in caplog.text


def test_a_request_that_repeats_an_earlier_one_drafts_as_it_did():
    """A seeded request run again (same prompt, same tokens sampled) in the
    row the first run left: under ``adaptive: "request"``, the same drafts,
    though the first run's state is still there (its draft-length history
    must not carry over)."""
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 8, 3, 4]
    steps = [[5, 9], [6], [7, 3, 4], [1], [3, 4], [5, 6, 7]]
    tokens = np.zeros((1, 200), dtype=np.int32)
    drafter = Drafter(config(k=6, max_model_len=200, adaptive="request"))
    runs = []
    for _ in range(3):
        seq, drafts = list(prompt), []
        for sampled in steps:
            seq += sampled
            tokens[0, :len(seq)] = seq
            drafts.append(drafter.propose([sampled], np.array([len(seq)]), tokens)[0])
        runs.append(drafts)
    assert runs[0] == runs[1] == runs[2]
    assert any(runs[0])


def test_a_corpus_bound_to_other_special_ids_is_refused_at_start(tmp_path):
    """The corpus's model signature is (vocab, bos, eos, pad) from the
    model's config, as pld.generate binds it: one saved for another eos is
    another tokenizer."""
    from pld.corpus import model_signature

    hf = types.SimpleNamespace(bos_token_id=1, eos_token_id=[2, 5], pad_token_id=None)
    assert model_signature(VOCAB, hf) == (VOCAB, 1, (2, 5), None)
    other = Corpus(1000)
    other.bind(VOCAB, (VOCAB, 1, 3, None))
    other.add([4, 5, 6])
    path = str(tmp_path / "eos3.pldc")
    other.save(path)
    with pytest.raises(ValueError, match="eos3.pldc.*another tokenizer"):
        Drafter(config(corpus=path))
    same = Corpus(1000)
    same.bind(VOCAB, (VOCAB, 1, 2, None))
    same.save(str(tmp_path / "eos2.pldc"))
    assert Drafter(config(corpus=str(tmp_path / "eos2.pldc"))).corpus.signature == (VOCAB, 1, 2, None)


def test_a_failure_inside_drafting_costs_a_step_its_drafts_not_the_engine(caplog, monkeypatch):
    tokens = np.zeros((1, 100), dtype=np.int32)
    tokens[0, :9] = [1, 7, 8, 9, 10, 11, 12, 7, 8]
    drafter = Drafter(config(k=4, max_model_len=100, adaptive=False))

    def broken(*args):
        raise RuntimeError("planted")

    monkeypatch.setattr(drafter, "_follow", broken)
    with caplog.at_level(logging.ERROR, logger="pld"):
        assert drafter.propose([[8]], np.array([9]), tokens) == [[]]
    assert "drafting failed" in caplog.text and drafter.num_requests == 0
    monkeypatch.undo()
    assert drafter.propose([[8]], np.array([9]), tokens) == [[9, 10, 11, 12]]


# ------------------------------------------------ the C calls a step makes on a row

DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


def _index(seq):
    index = _core.NgramIndex(3, 1, "recent", seed=0)
    index.extend(list(seq))
    return index


def test_first_unequal_names_the_first_span_that_differs():
    a = list(range(40))
    b = np.stack([np.full(40, -1, dtype=np.int32), np.array(a, dtype=np.int32)])  # a is row 1: item 40 on
    b[1, 20] = 99
    f = _index(a).first_unequal
    assert f(b, 40, 0, 16, 30, 40) == 2  # both equal: the number of pairs
    assert f(b, 40, 0, 16, 18, 22, 30, 40) == 1  # [18, 22) holds the changed item
    assert f(b, 40, 18, 22, 0, 16) == 0
    assert f(b, 0, 0, 16) == 0  # row 0 is not a
    assert f(b, 40, 20, 20, 21, 40) == 2  # an empty span is equal
    assert f(b, 40) == 0  # no pairs
    assert f(memoryview(b), 40, 0, 20) == 1
    assert f(b.astype(np.int64), 40, 0, 20) == 1 and f(b.astype(np.int64), 40, 0, 21) == 0
    assert _index([]).first_unequal(np.zeros(0, dtype=np.int32), 0, 0, 0) == 1
    big = np.array([2 ** 64 - 1], dtype=np.uint64)  # no int64 id: equal to none
    assert _index([0]).first_unequal(big, 0, 0, 1) == 0


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_first_unequal_agrees_with_slices(data):
    dtype = np.dtype(data.draw(st.sampled_from(DTYPES)))
    held = data.draw(st.lists(st.integers(0, 3), max_size=12))
    row = np.array(data.draw(st.lists(st.integers(0, 3), max_size=24)), dtype=dtype)
    at = data.draw(st.integers(0, len(row)))
    room = min(len(held), len(row) - at)
    spans = []
    for _ in range(data.draw(st.integers(0, 8))):
        start = data.draw(st.integers(0, room))
        spans.append((start, data.draw(st.integers(start, room))))
    want = next((j for j, (s, e) in enumerate(spans) if held[s:e] != row[at + s:at + e].tolist()), len(spans))
    assert _index(held).first_unequal(row, at, *[x for p in spans for x in p]) == want


@pytest.mark.parametrize("args, error", [
    ((np.arange(4), 0, 0, 5), ValueError),  # past the tokens indexed
    ((np.arange(6), 3, 0, 4), ValueError),  # past the row from at
    ((np.arange(4), 0, 3, 2), ValueError),  # stop before start
    ((np.arange(4), 0, -1, 2), ValueError),
    ((np.arange(4), 5, 0, 0), ValueError),  # at past the row
    ((np.arange(4), -1, 0, 1), ValueError),
    ((np.arange(4), 0, 0), TypeError),  # a start without its stop
    ((np.arange(4), 0) + (0, 1) * 9, TypeError),  # more than 8 pairs
    ((np.arange(4),), TypeError),
    ((np.arange(4), 0, 0, 1.0), TypeError),
    ((np.arange(4), 0, 0, np.int64(1)), TypeError),
    (("abcd", 0, 0, 1), TypeError),  # text: no buffer
    ((np.arange(4.0), 0, 0, 1), TypeError),  # not ids
    ((np.zeros((4, 4), dtype=np.int32)[:, 1], 0, 0, 1), TypeError),  # strided
])
def test_first_unequal_refuses_bad_arguments(args, error):
    with pytest.raises(error):
        _index(range(4)).first_unequal(*args)


def test_first_unequal_checks_every_span_before_comparing():
    # the first span differs, the second is out of range: the error, whatever the data
    with pytest.raises(ValueError):
        _index([7, 1]).first_unequal(np.array([0, 1]), 0, 0, 1, 0, 3)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_follow_is_extend_then_propose(data):
    dtype = np.dtype(data.draw(st.sampled_from(DTYPES)))
    seq = data.draw(st.lists(st.integers(0, 4), max_size=40))
    row = np.array(data.draw(st.lists(st.integers(0, 4), max_size=8)) + seq, dtype=dtype)
    at = len(row) - len(seq)
    done = data.draw(st.integers(0, len(seq)))
    n = data.draw(st.integers(done, len(seq)))
    want = data.draw(st.integers(0, 12))
    index, twin = _index(seq[:done]), _index(seq[:done])
    draft = index.follow(row, at, n, want)
    twin.extend(seq[done:n])
    assert draft == (twin.propose(want) if want else [])
    assert index.tokens() == seq[:n] and index.last_ngram == (twin.last_ngram if want else 0)


@pytest.mark.parametrize("args, error", [
    ((np.arange(8), 0, 2, 4), ValueError),  # n below the tokens indexed
    ((np.arange(8), 2, 7, 4), ValueError),  # past the row from at
    ((np.arange(8), -1, 4, 4), ValueError),
    ((np.arange(8), 0, 4, -1), ValueError),
    ((np.arange(8), 0, 4, 1 << 40), ValueError),  # want: no such draft
    ((np.arange(8), 0, 4), TypeError),
    ((np.arange(8), 0.0, 4, 4), TypeError),
    ((np.arange(8), 0, np.int64(4), 4), TypeError),
    ((np.arange(8.0), 0, 4, 4), TypeError),  # not ids
    ((np.array([0, 1, 2, 2 ** 64 - 1], dtype=np.uint64), 0, 4, 4), ValueError),  # an id past int64
    ((np.zeros((8, 8), dtype=np.int64)[:, 1], 0, 4, 4), TypeError),  # strided
])
def test_follow_refuses_bad_arguments_and_keeps_the_index(args, error):
    index = _index([0, 1, 2])
    with pytest.raises(error):
        index.follow(*args)
    assert index.tokens() == [0, 1, 2]


# ------------------------------------------------ token arrays vLLM never passes

def _wide(tokens):  # rows contiguous, the array not (a column slice of a wider one)
    wide = np.full((tokens.shape[0], tokens.shape[1] + 5), -3, dtype=tokens.dtype)
    wide[:, :tokens.shape[1]] = tokens
    return wide[:, :tokens.shape[1]]


@pytest.mark.parametrize("layout", [
    np.asfortranarray, _wide, lambda t: t.astype(">i4"), lambda t: t.astype(np.int64),
    lambda t: t.astype(np.uint16),
    "alternating",  # int32 and int64 in turn: the states read either
], ids=["fortran", "wide", "big-endian", "int64", "uint16", "alternating"])
def test_any_integer_token_array_drafts_as_the_reference(layout):
    rng = random.Random(11)
    batch = FakeBatch(3, 150, rng, 6)
    drafter = Drafter(config(k=4, max_model_len=150, max_num_seqs=3, adaptive=False))
    for step in range(40):
        random_events(batch, rng, 3, 6)
        sampled = batch.step()
        if layout == "alternating":
            tokens = batch.tokens.astype(np.int64) if step % 2 else batch.tokens
        else:
            tokens = layout(batch.tokens)
        drafts = drafter.propose(sampled, batch.lengths, tokens)
        for rid, draft in zip(batch.order, drafts):
            batch.drafts[rid] = list(draft)
        assert drafts == batch.reference(sampled, 4)


@pytest.mark.parametrize("tokens, lengths", [
    (np.zeros((1, 12), dtype=np.float32), [9]),  # not integer ids
    (np.zeros(12, dtype=np.int32), [9]),  # not [rows, width]
    ([[0] * 12], [9]),  # not an array
    (np.zeros((1, 12), dtype=np.int32), [13]),  # a length past the row
    (np.zeros((1, 12), dtype=np.int32), [-1]),
])
def test_a_bad_step_costs_its_drafts_and_the_next_drafts_again(tokens, lengths, caplog):
    good = np.zeros((1, 12), dtype=np.int32)
    good[0, :9] = [1, 7, 8, 9, 10, 11, 12, 7, 8]
    drafter = Drafter(config(k=4, max_model_len=100, adaptive=False))
    assert drafter.propose([[8]], np.array([9]), good) == [[9, 10, 11, 12]]
    with caplog.at_level(logging.ERROR, logger="pld"):
        assert drafter.propose([[8]], np.array(lengths), tokens) == [[]]
    assert "drafting failed" in caplog.text and drafter.num_requests == 0
    assert drafter.propose([[8]], np.array([9]), good) == [[9, 10, 11, 12]]


@pytest.mark.parametrize("lengths", [
    np.array([9.0]), np.array([9.9]), np.array([True]), [None], [2 ** 70], np.array([[9]]),
    np.array([], dtype=np.int32),  # fewer lengths than rows
])
def test_lengths_that_are_not_one_integer_a_row_fail_a_step_naming_them(lengths, caplog):
    """num_tokens_no_spec must hold an integer length a row: floats are
    not cut to integers (on the C step either), and the error names it."""
    good = np.zeros((1, 12), dtype=np.int32)
    good[0, :9] = [1, 7, 8, 9, 10, 11, 12, 7, 8]
    drafter = Drafter(config(k=4, max_model_len=100, adaptive=False))
    assert drafter.propose([[8]], np.array([9]), good) == [[9, 10, 11, 12]]
    good[0, 9] = 9
    with caplog.at_level(logging.ERROR, logger="pld"):
        assert drafter.propose([[9]], lengths, good) == [[]]
    assert "num_tokens_no_spec" in caplog.text and drafter.num_requests == 0
    assert drafter.propose([[9]], np.array([10]), good) == [[10, 11, 12, 7]]


def test_a_failed_step_learns_the_outputs_of_the_requests_in_rows_first():
    drafter = Drafter(config(k=4, adaptive=False, learn=True))
    tokens = np.zeros((1, 400), dtype=np.int32)
    tokens[0, :2] = [20, 10]
    _run(drafter, tokens, [[11], [12, 13]])
    assert drafter.propose([[14]], None, tokens) == [[]]
    assert drafter.corpus.sequences() == [[11, 12, 13]] and drafter.num_requests == 0


def test_a_request_cut_below_its_head_starts_afresh_and_is_found_again_after_a_move():
    """vLLM discarded ids (the row is shorter than its state): the row is
    matched in full and drafts from a fresh index, whose key follows its
    head tokens back up as others are accepted in their place."""
    tokens = np.zeros((2, 100), dtype=np.int32)
    drafter = Drafter(config(k=3, max_model_len=100, adaptive=False))
    seq = list(range(1, 21))
    tokens[0, :20] = seq
    drafter.propose([[20]], np.array([20]), tokens)
    old = drafter.rows[0]
    seq = seq[:HEAD - 6]
    drafter.propose([[seq[-1]]], np.array([len(seq)]), tokens)
    state = drafter.rows[0]
    assert state is not old and state.n == len(seq)
    for t in range(30, 40):
        seq.append(t)
        tokens[0, len(seq) - 1] = t
        drafter.propose([[t]], np.array([len(seq)]), tokens)
    assert drafter.rows[0] is state and len(seq) > HEAD
    tokens[1, :len(seq)] = seq  # moved to row 1; a new request prefills in row 0
    tokens[0, :5] = [9, 9, 9, 9, 9]
    drafter.propose([[], [seq[-1]]], np.array([5, len(seq)]), tokens)
    assert drafter.rows[1] is state


def test_after_a_step_vllm_did_not_show_each_row_finds_its_own_state_at_once(monkeypatch):
    """vLLM skips the drafter for the whole batch in a step where a request
    nears max_model_len; at the next every row has grown by more than it
    sampled and is matched in full. Requests sharing a system prompt share
    a head key: each row's own state is checked first, once, not every
    state under that key (rows x states full checks: half a second at
    1,024 rows)."""
    rows = 32
    rng = np.random.default_rng(0)
    drafter = Drafter(config(k=4, max_model_len=400, max_num_seqs=rows, adaptive=False))
    tokens = np.zeros((rows, 400), dtype=np.int32)
    lengths = np.full(rows, 60, dtype=np.int32)
    system = rng.integers(3, VOCAB, HEAD + 4)
    for i in range(rows):
        tokens[i, :len(system)] = system
        tokens[i, len(system):60] = rng.integers(3, VOCAB, 60 - len(system))

    def step(shown=True):
        sampled = []
        for i in range(rows):
            sampled.append([int(rng.integers(3, VOCAB))])
            tokens[i, lengths[i]] = sampled[-1][0]
            lengths[i] += 1
        return drafter.propose(sampled, lengths, tokens) if shown else None

    for _ in range(3):
        step()
    held = {i: id(s) for i, s in drafter.rows.items()}
    step(shown=False)
    checks = []
    real = pld.vllm._Request.is_prefix_of
    monkeypatch.setattr(pld.vllm._Request, "is_prefix_of", lambda self, *a: checks.append(1) or real(self, *a))
    step()
    assert {i: id(s) for i, s in drafter.rows.items()} == held and len(held) == rows
    assert len(checks) == rows


@pytest.mark.parametrize("adaptive", ["request", True])
def test_a_draft_whose_verification_vllm_did_not_show_is_not_learned_as_rejected(adaptive):
    """A step vLLM did not show the drafter verified the draft before it:
    at the next step the row has grown by more than it sampled, and how
    that draft fared is unknown. It is not learned as rejected (which made
    a request's own schedule pause and shrink, and taught the budget a
    rejection that never happened)."""
    period = list(range(3, 13))
    tokens = np.zeros((1, 400), dtype=np.int32)
    n = 4 * len(period)
    tokens[0, :n] = period * 4
    drafter = Drafter(config(k=4, max_model_len=400, max_num_seqs=1, adaptive=adaptive))
    learned = []
    if drafter.budget is not None:  # (the outcomes it learns at each plan, from C's step or Python's)
        budget, real = drafter.budget, drafter.budget._learn
        budget._learn = lambda: learned.extend((p, a) for _, p, a, _ in budget.outcomes) or real()

    def verify(draft):
        """The model continues the period: the draft's tokens that do, then one more."""
        nonlocal n
        kept = []
        for t in draft:
            if t != period[(n + len(kept)) % len(period)]:
                break
            kept.append(t)
        sampled = kept + [period[(n + len(kept)) % len(period)]]
        tokens[0, n:n + len(sampled)] = sampled
        n += len(sampled)
        return sampled

    drafts = [drafter.propose([verify([])], np.array([n]), tokens)[0]]
    for _ in range(5):
        drafts.append(drafter.propose([verify(drafts[-1])], np.array([n]), tokens)[0])
    assert all(drafts[-3:])  # (the period continues: every draft is accepted whole)
    draft = drafts[-1]
    before = len(draft)
    verify(draft)  # vLLM verifies it, then skips the drafter this step
    draft = drafter.propose([verify([])], np.array([n]), tokens)[0]
    assert len(draft) == before
    if drafter.budget is not None:
        learned += [(p, a) for _, p, a, _ in drafter.budget.outcomes]  # (not yet learned)
        assert learned and all(a == p for p, a in learned)
