"""The one step (pld.decoder.Decoder) in parts: the eos cuts, the block a
forward sees, the budget over rows, the slot table, and the step-width
invariant that PLD_DEBUG_CACHE checks."""
from __future__ import annotations

import random

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


# -- the eos cuts ----------------------------------------------------------------

@pytest.mark.parametrize("tokens, eos, expected", [
    ([5, 6, 7], (), None),
    ([5, 6, 7], (9,), None),
    ([5, 2, 7], (2,), 1),
    ([2, 2, 2], (2,), 0),
    ([5, 6, 3], (3, 6), 1),
    ([], (2,), None),
])
def test_eos_at_finds_the_first_eos(tokens, eos, expected):
    """A row keeps tokens[:at + 1] and stops; a draft is cut to tokens[:at]."""
    from pld.config import eos_at

    assert eos_at(tokens, eos) == expected


def test_commit_cuts_at_eos_budget_and_criteria():
    """_cut: through the first eos; within the row's budget; at the first
    token after which a criterion says stop (the criterion sees each
    prefix, as plain decoding calls it)."""
    from types import SimpleNamespace

    from pld.accept_walk import Walk
    from pld.config import DecodeConfig
    from pld.decoder import Decoder
    from pld.row_state import Row

    config = DecodeConfig(max_new_tokens=6, eos_token_id=[9])
    row = Row(0, torch.tensor([[1, 2, 3]]), None, config, "first")
    seen = []

    def stop_after_7(ids, scores):
        seen.append(ids[0].tolist())
        return ids[0, -1].item() == 7

    fake = SimpleNamespace(config=config, eos=(9,), criteria=[])
    assert Decoder._cut(fake, row, Walk([0, 1], [4, 9, 5], [0, 1, 2])) == (2, True)
    assert Decoder._cut(fake, row, Walk([0, 1, 2], [4, 5, 6, 8], [0, 1, 2, 3])) == (4, False)
    row.append([4, 5, 6, 8])  # 4 of 6 new tokens: room for 2
    assert Decoder._cut(fake, row, Walk([0, 1], [1, 1, 1], [0, 1, 2])) == (2, True)
    fake.criteria = [stop_after_7]
    assert Decoder._cut(fake, row, Walk([0], [7, 1], [0, 1])) == (1, True)
    assert seen == [[1, 2, 3, 4, 5, 6, 8, 7]]


# -- what a forward's new tokens see ------------------------------------------------

def test_block_visibility_of_the_root_nodes_and_filler():
    from pld.token_tree import block_visibility

    # the pending token (the root), a tree: 0 <- root, 1 <- 0, 2 <- root; 1 filler slot
    seen = block_visibility([-1, 0, -1], 4).int().tolist()
    assert seen == [
        [1, 0, 0, 0, 0],  # the root sees itself
        [1, 1, 0, 0, 0],  # node 0: the root and itself
        [1, 1, 1, 0, 0],  # node 1: its parent too
        [1, 0, 0, 1, 0],  # node 2: a sibling of 0, not 0
        [1, 0, 0, 0, 1],  # filler: the root and itself
    ]
    # a root that is padding (one row's mask may end in 0): no token sees it
    padded = block_visibility([-1, 0, -1], 4, root_valid=False).int().tolist()
    assert padded == [[0] + r[1:] for r in seen]


def test_block_visibility_of_a_chain_is_causal():
    from pld.token_tree import block_visibility

    seen = block_visibility([-1, 0, 1], 3)
    assert torch.equal(seen, torch.ones(4, 4, dtype=torch.bool).tril())


# -- one budget over rows ------------------------------------------------------------

def test_choose_rows_picks_one_width_for_every_row():
    from pld.forward_cost import ForwardCost
    from pld.token_tree import choose_rows

    cost = ForwardCost([1, 2, 8], [1.0, 1.2, 2.0])
    one = [0.9, 0.8, 0.1, 0.7]
    assert choose_rows([one], cost, 1, 32) == [[0, 1, 3]]  # (one row: its likely chain)
    # a likely row pays for a width a poor row alone would not: both get it
    rich, poor = [0.95, 0.9, 0.9], [0.05]
    assert choose_rows([poor], cost, 1, 32) == [[]]
    chosen = choose_rows([rich, poor], cost, 1, 32)
    assert chosen[0] == [0, 1, 2] and chosen[1] == [0]
    assert choose_rows([rich, []], cost, 1, 2) == [[0, 1], []]  # max_width a row


def test_choose_rows_with_a_steep_cost_picks_nothing():
    from pld.forward_cost import ForwardCost
    from pld.token_tree import choose_rows

    assert choose_rows([[0.9, 0.9], [0.9]], ForwardCost([1, 2], [1.0, 10.0]), 1, 8) == [[], []]


# -- the slot table ---------------------------------------------------------------------

def test_slot_table_gathers_one_row_and_holes_a_batch():
    from pld.slot_table import SlotTable

    one = SlotTable(1, torch.device("cpu"), capacity=2)
    one.stage(torch.tensor([[True] * 5]), torch.tensor([[0, 1, 2, 2, 3]]))
    assert one.keep([[0, 1, 3]], gather=True) == 3  # the pending tokens and the path's node (not 2)
    assert one.length == 3 and one.positions[0, :3].tolist() == [0, 1, 2]
    two = SlotTable(2, torch.device("cpu"))
    two.stage(torch.tensor([[False, True, True], [True, True, True]]), torch.tensor([[0, 0, 1], [0, 1, 2]]))
    assert two.keep([[0, 1, 2], [0, 1, 2]], gather=False) == 3
    two.stage(torch.ones(2, 3, dtype=torch.bool), torch.tensor([[2, 3, 3], [3, 4, 5]]))
    assert two.keep([[0, 2], [0]], gather=False) == 3
    assert two.valid[:, :two.length].int().tolist() == [[0, 1, 1, 1, 0, 1], [1, 1, 1, 1, 0, 0]]
    assert two.held() == [4, 4]


def test_slot_table_compaction_keeps_each_rows_slots_in_order(monkeypatch):
    from pld import slot_table

    monkeypatch.setattr(slot_table, "COMPACT_MIN_SLOTS", 4)
    monkeypatch.setattr(slot_table, "COMPACT_SHARE", 0.1)
    table = slot_table.SlotTable(2, torch.device("cpu"))
    table.stage(torch.tensor([[1, 0, 0, 1, 0, 1], [0, 1, 0, 0, 0, 0]], dtype=torch.bool),
                torch.tensor([[0, 9, 9, 1, 9, 2], [9, 0, 9, 9, 9, 9]]))
    table.keep([[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]], gather=False)
    index = table.compaction_index()
    assert index is not None and index.shape == (2, 3)
    table.gather(index)
    assert table.positions[0, :3].tolist() == [0, 1, 2] and table.positions[1, 2].item() == 0
    assert table.valid[:, :3].int().tolist() == [[1, 1, 1], [0, 0, 1]]


# -- the step-width invariant ---------------------------------------------------------------

def _batch(prompts):
    L = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), L), dtype=torch.long)
    mask = torch.zeros((len(prompts), L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = torch.tensor(p)
        mask[i, L - len(p):] = 1
    return ids, mask


@pytest.mark.parametrize("rows, tree", [(1, False), (1, True), (3, False), (3, True)])
def test_every_forward_after_the_prefill_is_as_wide_as_the_root_and_the_chosen_nodes(monkeypatch, rows, tree):
    """Every forward after the prefill feeds exactly the pending token and
    the widest row's chosen nodes (nothing repaired by feeding more), and
    the tokens are each row's greedy ones."""
    from pld import loop
    from pld.decoder import Decoder
    from pld.hf_adapter import TransformersAdapter

    model = mf.sharp_model("llama")
    widths, planned = [], []
    forward_rows = TransformersAdapter.forward_rows
    verify = Decoder.verify

    def recording_forward(self, ids, *args, **kwargs):
        if kwargs.get("cache") is None:
            widths.append(ids.shape[1])
        return forward_rows(self, ids, *args, **kwargs)

    def recording_verify(self, plans):
        planned.append(None if self.prefill else 1 + max(len(p.chosen) for p in plans))
        return verify(self, plans)

    monkeypatch.setattr(TransformersAdapter, "forward_rows", recording_forward)
    monkeypatch.setattr(Decoder, "verify", recording_verify)
    rng = random.Random(f"width-{rows}-{tree}")
    prompts = [mf.repeated_prompt(rng) for _ in range(rows)]
    ids, mask = _batch(prompts)
    with torch.no_grad():
        _, new, stats = loop.run_batch(model, ids, attention_mask=mask, max_new_tokens=30, eos_token_id=None,
                                       draft_tree=tree, cost_aware=False)
    assert new == [mf.greedy(model, mf.as_ids(p), 30) for p in prompts]
    widths = widths[-len(planned):]  # (the model's probe runs first, on a fresh model)
    assert [w for w, p in zip(widths, planned) if p is not None] == [p for p in planned if p is not None]
    assert stats.proposed_tokens > 0 and len(planned) == stats.steps


def test_a_step_that_keeps_one_node_too_few_is_caught(monkeypatch):
    """PLD_DEBUG_CACHE: a commit that drops an accepted node from the cache
    raises at once (the next forward would otherwise repair it by feeding
    the node again: the same tokens, a wider forward)."""
    from pld import loop
    from pld.decoder import Decoder

    assert loop.DEBUG_CHECKS  # the suite runs with PLD_DEBUG_CACHE=1 (conftest)
    keep = Decoder._keep_cache

    def one_too_few(self, kept):
        return keep(self, [k[:-1] if len(k) > 1 and not self.prefill else k for k in kept])

    monkeypatch.setattr(Decoder, "_keep_cache", one_too_few)
    model = mf.sharp_model("llama")
    ids = mf.as_ids(mf.repeated_prompt(random.Random("too-few")))
    with torch.no_grad(), pytest.raises(RuntimeError, match="cached tokens"):
        loop.run(model, ids, max_new_tokens=30, eos_token_id=None, cost_aware=False)


def test_two_threads_generating_at_once_each_get_greedys_tokens():
    """No run changes state another run reads: two threads decode with one
    model at once (linear drafts in one, a tree in the other, the kernel
    switches entering and leaving in between) and each gets plain greedy's
    tokens."""
    import threading

    import pld

    model = mf.sharp_model("llama")
    rng = random.Random("threads")
    prompts = [mf.repeated_prompt(rng) for _ in range(4)]
    expected = [mf.greedy(model, mf.as_ids(p), 30) for p in prompts]
    got, errors = {}, []
    start = threading.Barrier(2)

    def work(name, tree):
        try:
            torch.set_num_threads(1)
            start.wait()
            for i, p in enumerate(prompts):
                out = pld.generate(model, mf.as_ids(p), max_new_tokens=30, eos_token_id=None, draft_tree=tree)
                got[(name, i)] = out.new_tokens
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n, t)) for n, t in (("linear", False), ("tree", True))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    for name in ("linear", "tree"):
        assert [got[(name, i)] for i in range(len(prompts))] == expected, name


@pytest.mark.parametrize("value, error", [
    (("nope",), ValueError), ((), ValueError), (3, TypeError), ((1, 2), TypeError), ([b"prompt"], TypeError),
])
def test_draft_sources_are_refused_clearly(value, error):
    from pld.config import DecodeConfig

    with pytest.raises(error, match="draft_sources"):
        DecodeConfig(draft_sources=value)
    assert DecodeConfig(draft_sources=["successors", "prompt_tree"]).draft_sources == ("successors", "prompt_tree")


@pytest.mark.parametrize("prompt_len", [1, 5, 70])
def test_a_rows_host_tail_is_the_end_of_its_sequence(prompt_len):
    """A row keeps its sequence's last tokens on the host (a step reads them
    there, not from the model's device): its last two and any tail, within
    what it keeps or beyond, are the sequence's."""
    import torch

    from pld.config import DecodeConfig
    from pld.row_state import HOST_TAIL, Row

    rng = random.Random(prompt_len)
    row = Row(0, torch.tensor([[rng.randrange(50) for _ in range(prompt_len)]]), None,
              DecodeConfig(max_new_tokens=300), "recent")
    for _ in range(40):
        row.begin_step(3)
        seq = row.ids()[0].tolist()
        assert (row.previous, row.root) == ((seq[-2] if len(seq) > 1 else -1), seq[-1])
        for n in (-1, 0, 1, 3, HOST_TAIL, HOST_TAIL + 5, len(seq) + 3):
            assert row.tail(n) == (seq[max(len(seq) - n, 0):] if n > 0 else [])
        tokens = [rng.randrange(50) for _ in range(rng.randrange(1, 9))]
        row.write(tokens)
        row.append(tokens)
