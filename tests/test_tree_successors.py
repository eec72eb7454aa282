"""Candidates beyond the input (tree_successors=True): the model's own
remembered successors (pld.successors.SuccessorTable) grafted onto the
tree (pld.token_tree.graft, TreeDecoder.guess_ahead).

Greedy output stays plain greedy's (tiny models, here and in
test_tree_decoding.py's exactness test); the successors are verified and
accepted; the index is left as it was after a guess; sampling through
successor nodes keeps the model's law (chi-square on three tokens, the
later two drawn where successors are in the tree).
"""
from __future__ import annotations

import random
from collections import Counter

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture
from test_tree_decoding import _tree_of

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]


# -- the table -----------------------------------------------------------------

def test_successor_table_keeps_the_top_k_of_the_last_row_of_each_token():
    import torch

    from pld.successors import SuccessorTable

    table = SuccessorTable(6, k=2)
    assert table.successors(3, 2) == []
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.0, 0.0, 0.0],    # after 3: 1, 3
                           [9.0, 0.0, 0.0, 0.0, 0.0, 8.0],    # after 2: 0, 5
                           [0.0, 0.0, 7.0, 0.0, 6.0, 0.0]])   # after 3 again: 2, 4 (the later row)
    table.update(torch.tensor([3, 2, 3]), logits)
    assert table.successors(3, 2) == [2, 4]
    assert table.successors(2, 1) == [0]
    assert table.successors(1, 2) == []
    assert table.successors(-1, 2) == [] and table.successors(6, 2) == []
    # tokens outside the table, and logits wider than it, are ignored
    wide = torch.zeros(2, 8)
    wide[0, 7], wide[0, 1] = 9.0, 8.0
    wide[1, 4] = 1.0
    table.update(torch.tensor([1, 99]), wide)
    assert table.successors(1, 2) == [1]  # 7 is past the vocabulary
    table.update(torch.tensor([], dtype=torch.long), torch.zeros(0, 6))
    with pytest.raises(ValueError):
        SuccessorTable(0)


def _agreement_of(table, pairs, grandparent, parent, token):
    """Plain Python: 0 the pair's remembered successor, 1 (no pair) the
    parent's top one, 2 another token, 3 nothing remembered after ``parent``."""
    if (grandparent, parent) in pairs:
        return 0 if pairs[(grandparent, parent)] == token else 2
    top = table[parent, 0].item() if 0 <= parent < table.shape[0] else -1
    return 3 if top < 0 else 1 if top == token else 2


def test_pairs_remember_the_successor_after_two_tokens_and_come_first():
    import torch

    from pld.successors import SuccessorTable

    table = SuccessorTable(6, k=2)
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.0, 0.0, 0.0],    # after (2, 3): 1, then 3
                           [0.0, 0.0, 0.0, 1.0, 0.0, 9.0]])   # after (4, 3): 5, then 3
    table.update(torch.tensor([3, 3]), logits, [2, 4])
    assert table.pairs == {(2, 3): 1, (4, 3): 5}
    assert table.successors(3, 2) == [5, 3]      # the token's own: its last row
    assert table.successors(3, 2, 2) == [1, 5]   # the pair's first, then the token's
    assert table.successors(3, 1, 4) == [5]      # no repeat
    assert table.successors(3, 2, 0) == [5, 3]   # an unseen pair: the token's own
    table.update(torch.tensor([3]), logits[:1], [-1])  # no previous token: no pair
    assert table.pairs == {(2, 3): 1, (4, 3): 5}
    with pytest.raises(ValueError, match="previous"):
        table.update(torch.tensor([3, 3]), logits, [2])


def test_agreement_matches_a_plain_python_reading_of_the_table():
    import torch

    from pld.successors import SuccessorTable

    rng = random.Random("agreement")
    table = SuccessorTable(7, k=3)
    for _ in range(30):
        n = rng.randint(0, 4)
        inputs = torch.tensor([rng.randrange(-1, 9) for _ in range(n)], dtype=torch.long)
        table.update(inputs, torch.randn(n, rng.choice([5, 7, 9])),
                     [rng.randrange(-1, 9) for _ in range(n)])
        parents = [rng.randrange(-2, 9) for _ in range(rng.randint(0, 12))]
        grandparents = [rng.randrange(-1, 9) for _ in parents]
        tokens = [rng.randrange(0, 9) for _ in parents]
        assert table.agreement(parents, tokens, grandparents) == [
            _agreement_of(table.table, table.pairs, g, p, t)
            for g, p, t in zip(grandparents, parents, tokens)]
        assert table.agreement(parents, tokens) == [
            _agreement_of(table.table, table.pairs, -1, p, t) for p, t in zip(parents, tokens)]
    # every remembered pair agrees with its own successor
    keys = list(table.pairs)
    assert keys and table.agreement([p for _, p in keys], [table.pairs[k] for k in keys],
                                    [g for g, _ in keys]) == [0] * len(keys)


def test_graft_adds_missing_successors_breadth_first_within_limits():
    from pld.token_tree import graft

    known = {0: [1, 2, 3], 1: [4, 5], 2: [6], 4: [7], 9: [1]}

    seen = []

    def successors(token, count, previous):
        seen.append((previous, token))
        return known.get(token, [])[:count]

    tree = _tree_of([1, 9], [-1, 0], [1, 2], ngrams=[2, 2])  # prompt lookup: 1 -> 9
    out = graft(tree, 0, successors, shape=(3, 2, 1), max_depth=3, max_nodes=64, eos=(5,),
                root_previous=8)
    assert out.tokens[:2] == [1, 9] and out.ngrams[:2] == [2, 2]  # the input's nodes first, kept
    # each node is asked about after its parent's token (the root after 8)
    assert seen[:3] == [(8, 0), (0, 1), (1, 9)]
    nodes = {(out.parents[j], out.tokens[j]): j for j in range(len(out))}
    assert len(nodes) == len(out)  # no duplicate children
    # the root (token 0) gets 2 and 3 (1 is prompt lookup's already), ranked
    for token, rank in ((2, 2), (3, 3)):
        j = nodes[(-1, token)]
        assert (out.ngrams[j], out.supports[j], out.depths[j]) == (0, rank, 1)
    # node 1 (depth 1) gets 4, 5; node 9 (depth 2) gets 1 (shape[2] = 1)
    assert (0, 4) in nodes and (0, 5) in nodes and (1, 1) in nodes
    assert out.depths[nodes[(1, 1)]] == 3
    j5 = nodes[(0, 5)]
    assert all(out.parents[k] != j5 for k in range(len(out)))  # nothing after eos
    # depth 3 is the limit: node 4's successor 7 would be at depth 3 (shape[2])
    j4 = nodes[(0, 4)]
    assert [out.tokens[k] for k in range(len(out)) if out.parents[k] == j4] == [7]
    assert all(d <= 3 for d in out.depths)
    assert all(p < j for j, p in enumerate(out.parents))  # parents first
    small = graft(tree, 0, successors, shape=(3, 2, 1), max_depth=3, max_nodes=3)
    assert len(small) == 3
    shallow = graft(tree, 0, successors, shape=(3, 2, 1), max_depth=1, max_nodes=64)
    assert max(shallow.depths[2:]) == 1


def test_with_subtree_hangs_a_tree_under_a_new_root_child():
    from pld.token_tree import with_subtree

    tree = _tree_of([1, 2], [-1, 0], [1, 2], ngrams=[2, 2])
    below = _tree_of([7, 8, 9], [-1, 0, -1], [1, 2, 1], ngrams=[3, 3, 1], supports=[2, 2, 1])
    out = with_subtree(tree, 5, 0, 1, below)
    assert out.tokens == [1, 2, 5, 7, 8, 9]
    assert out.parents == [-1, 0, -1, 2, 3, 2]
    assert out.depths == [1, 2, 1, 2, 3, 2]
    assert out.ngrams == [2, 2, 0, 3, 3, 1] and out.supports == [1, 1, 1, 2, 2, 1]


def test_scale_follows_accepted_per_predicted_and_keeps_the_order():
    from pld.token_tree import MAX_PROBABILITY, PRIOR_SCALE, AcceptanceModel

    model = AcceptanceModel()
    assert model.scale == pytest.approx(PRIOR_SCALE)
    tree = _tree_of([1, 2], [-1, 0], [1, 2])
    for _ in range(200):  # predicted 1 a step, none accepted
        model.update(tree, [0, 1], [], predicted=1.0)
    assert model.scale < 0.1
    for _ in range(400):  # predicted 1, both accepted
        model.update(tree, [0, 1], [0, 1], predicted=1.0)
    assert 1.2 < model.scale < 2.0
    reach = [0.9, 0.6, 0.3, 0.1]
    scaled = model.scaled(reach)
    assert scaled[0] == MAX_PROBABILITY and all(a >= b for a, b in zip(scaled, scaled[1:]))
    assert scaled[3] == pytest.approx(0.1 * model.scale)


# -- in the decoder ------------------------------------------------------------

def _decoder(model, ids, on_step=None, **options):
    from pld import loop
    from pld.config import DecodeConfig
    from pld.kv_cache import cache_for

    config = DecodeConfig(**{"draft_tree": True, "tree_successors": True, "eos_token_id": None,
                             **options})
    return loop.prepare(model, ids, config, cache=cache_for(model, ids.shape[1] + config.max_new_tokens + 64),
                        on_step=on_step)


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_successor_nodes_are_verified_and_accepted_and_the_index_is_restored(arch):
    import torch

    model = mf.sharp_model(arch)
    rng = random.Random(f"successors-{arch}")
    verified = accepted = 0
    for _ in range(6):
        ids = mf.as_ids([rng.randrange(mf.PROMPT_VOCAB) for _ in range(rng.randint(2, 8))])
        steps = []
        adapter, decoder = _decoder(model, ids, on_step=steps.append, max_new_tokens=40, cost_aware=False,
                                    tree_width=16)
        row = decoder.rows[0]
        with torch.no_grad(), adapter.kernels():
            while True:
                before = row.cur
                root = int(row.buf.ids[0, before - 1])
                successors = row.memory.get("successors")
                table = successors.table.clone() if successors else None
                pairs = dict(successors.pairs) if successors else None
                previous = int(row.buf.ids[0, before - 2]) if before >= 2 else -1
                more = decoder.step()
                successors = row.memory["successors"]
                assert len(row.index) == row.cur  # a guess leaves no token behind
                record = steps[-1]
                tree, chosen = record.tree, record.chosen
                path = [chosen.index(j) for j in record.path]  # offsets in chosen
                # each row's pair (the token before its input, its input) maps
                # to the model's token there, where no later row shares the pair
                keys = [(previous, root)] + [
                    (root if tree.parents[j] < 0 else tree.tokens[tree.parents[j]], tree.tokens[j])
                    for j in chosen]
                rows = [0] + [1 + j for j in path]  # the rows the walk read
                for i, r in enumerate(rows):
                    if before + i < row.cur and keys[r][0] >= 0 and keys[r] not in keys[r + 1:]:
                        assert successors.pairs[keys[r]] == int(row.buf.ids[0, before + i])
                if not chosen or root not in [tree.tokens[j] for j in chosen]:
                    # the root's row (argmax: the step's first new token) was remembered
                    assert successors.successors(root, 1) == [int(row.buf.ids[0, before])]
                if chosen and table is not None:
                    # each node's agreement is the table's as the step proposed
                    above = [root if p < 0 else tree.tokens[p] for p in tree.parents]
                    assert tree.agreement == [
                        _agreement_of(table, pairs, previous if p < 0 else above[p], a, t)
                        for p, a, t in zip(tree.parents, above, tree.tokens)]
                if chosen:
                    verified += sum(tree.ngrams[j] == 0 for j in chosen)
                    accepted += sum(tree.ngrams[j] == 0 for j in record.path)
                if not more:
                    break
        assert row.buf.ids[0, ids.shape[1]:row.cur].tolist() == mf.greedy(model, ids, 40)
    assert verified >= 20 and accepted >= 5, (verified, accepted)


# -- sampling --------------------------------------------------------------------

def test_joint_distribution_of_three_tokens_through_successor_nodes():
    """Tokens 2 and 3 are drawn in steps whose trees hold successor nodes
    (the first step's rows filled the table): the three tokens' joint
    histogram fits p(t1) p(t2 | t1) p(t3 | t1 t2), and not a law that
    ignores t2 in p(t3 | ...)."""
    import torch

    import pld
    from pld.decoder import Decoder
    from test_accept import chi2_pvalue
    from test_hf_sampling import ALPHA, TEMPERATURE, V, _next_probs, _pooled, _stat_model

    model = _stat_model()
    # (1, 2) continues four ways: the first step's rows fill the table for most tokens
    prompt = [1, 2, 3, 5, 1, 2, 4, 6, 1, 2, 5, 0, 1, 2, 6, 3, 1, 2]
    p1 = _next_probs(model, prompt)
    p2 = {a: _next_probs(model, prompt + [a]) for a in range(V)}
    law = {}
    for a in range(V):
        for b in range(V):
            p3 = _next_probs(model, prompt + [a, b])
            for c in range(V):
                law[(a * V + b) * V + c] = p1[a] * p2[a][b] * p3[c]
    law = [law[i] for i in range(V ** 3)]
    assert abs(sum(law) - 1) < 1e-9

    seen = Counter()
    original = Decoder.propose

    def spy(self):
        plans = original(self)
        (plan,) = plans
        if self.model.cached and plan.chosen:  # a drafted step after the first
            seen["steps"] += 1
            seen["with successors"] += any(plan.tree.ngrams[j] == 0 for j in plan.chosen)
        return plans

    N = 3000
    counts = Counter()
    ids = torch.tensor([prompt], device=model.device)
    torch.manual_seed(7)
    Decoder.propose = spy
    try:
        for _ in range(N):
            gen = pld.generate(model, ids, max_new_tokens=3, prompt_lookup_num_tokens=2, max_matching_ngram_size=2,
                               tree_candidates=4, do_sample=True, temperature=TEMPERATURE, eos_token_id=None,
                               draft_tree=True, tree_successors=True, cost_aware=False)
            a, b, c = gen.new_tokens
            counts[(a * V + b) * V + c] += 1
    finally:
        Decoder.propose = original
    # successors were verified in most later steps
    assert seen["with successors"] > 0.5 * seen["steps"] and seen["steps"] > N // 3, seen
    pooled_counts, pooled_probs = _pooled(counts, law, N)
    assert chi2_pvalue(pooled_counts, pooled_probs) > ALPHA
    # power: the same draws reject p(t3 | t1) in place of p(t3 | t1 t2)
    wrong = []
    for a in range(V):
        for b in range(V):
            for c in range(V):
                marg = sum(p2[a][bb] * _next_probs(model, prompt + [a, bb])[c] for bb in range(V))
                wrong.append(p1[a] * p2[a][b] * marg)
    wrong_counts, wrong_probs = _pooled(counts, wrong, N)
    assert chi2_pvalue(wrong_counts, wrong_probs) < ALPHA
