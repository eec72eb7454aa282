"""Token-tree drafts (draft_tree=True): greedy output equals plain greedy
decoding (float32, tiny models of three architectures, context-sensitive
variants that expose a wrong KV cache), with eos, budgets, left padding,
logits processors and scores; seeded sampling repeats; the fallback to
linear drafts; and the tree's parts (choice under the budget, attention
mask, cost table).

The sampling law through a tree is checked in test_tree_sampling.py.
"""
from __future__ import annotations

import logging
import random

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]


def _tree(model, ids, n_new, **kw):
    import pld

    kw.setdefault("eos_token_id", None)
    return pld.generate(model, ids, max_new_tokens=n_new, draft_tree=True, record_steps=True, **kw)


def _branching_prompt(rng, vocab=mf.PROMPT_VOCAB):
    """A prompt whose suffix recurs with different continuations, so that
    trees branch: a key bigram, then several spans each led by it."""
    key = [rng.randrange(vocab), rng.randrange(vocab)]
    prompt = [rng.randrange(vocab) for _ in range(rng.randint(0, 6))]
    for _ in range(rng.randint(2, 5)):
        prompt += key + [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
    return prompt + key


@pytest.mark.parametrize("arch, sharp", [(a, False) for a in mf.ALL_ARCHS]
                         + [(a, True) for a in mf.ARCHS])
def test_tree_greedy_exact(arch, sharp, caplog):
    caplog.set_level(logging.INFO, logger="pld")
    model = mf.sharp_model(arch) if sharp else mf.tiny_model(arch)
    rng = random.Random(f"tree-{arch}-{sharp}")
    drafted = branched = 0
    for i in range(24):
        prompt = _branching_prompt(rng) if i % 2 else mf.repeated_prompt(rng)
        ids = mf.as_ids(prompt)
        n_new = [1, 2, rng.randint(3, 12), rng.randint(13, 40)][i % 4]
        expected = mf.greedy(model, ids, n_new)
        eos = rng.choice(expected) if expected and rng.random() < 0.3 else None
        if eos is not None:
            expected = mf.greedy(model, ids, n_new, eos=eos)
        k = rng.choice([1, 3, 5, 10])
        gen = _tree(model, ids, n_new, prompt_lookup_num_tokens=k, max_matching_ngram_size=rng.choice([1, 2, 3]),
                    tree_width=rng.choice([1, 4, 16, 64]), tree_candidates=rng.choice([1, 4, 8]),
                    tree_successors=bool(i % 3), eos_token_id=eos,
                    cost_aware=i % 4 == 3)  # the budget a quarter of the time (its choices follow timings)
        assert gen.new_tokens == expected, dict(prompt=prompt, n_new=n_new, k=k, eos=eos)
        drafted += sum(r.proposed > 0 for r in gen.stats.records)
        branched += sum(r.proposed > r.accepted + 1 for r in gen.stats.records)
    assert drafted >= 20  # trees were verified, not only plain steps
    assert branched >= 5
    assert not [r for r in caplog.records if "instead of a token tree" in r.getMessage()]


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_tree_accepts_more_than_one_token_a_step(arch):
    model = mf.tiny_model(arch)
    rng = random.Random(f"tree-accept-{arch}")
    long_steps = 0
    for _ in range(10):
        ids = mf.as_ids(mf.repeated_prompt(rng))
        gen = _tree(model, ids, 24, cost_aware=False)  # every node: the count does not follow timings
        assert gen.new_tokens == mf.greedy(model, ids, 24)
        long_steps += sum(r.accepted >= 2 for r in gen.stats.records)
    assert long_steps >= 3


def test_a_first_step_tree_is_verified_with_no_prompt_wide_mask(monkeypatch):
    """A row whose first step (the prefill) drafts a branching tree: the
    prompt but its last token goes through one causal forward with a 2D
    mask, then the tree through a mask of 1 + W queries, as at any step;
    never a 4D mask as wide as the prompt (P^2 entries: 4 GiB of float32
    at 32k tokens). Tokens are greedy's, with PLD_DEBUG_CACHE's check
    after every step."""
    from pld import hf_adapter
    from pld.token_tree import is_chain

    model = mf.tiny_model("llama")
    rng = random.Random("prefill-tree")
    queries, branched = [], 0
    real = hf_adapter.TransformersAdapter.masks

    def spy(self, allowed, key_positions, query_positions):
        queries.append(allowed.shape[1])
        return real(self, allowed, key_positions, query_positions)

    monkeypatch.setattr(hf_adapter.TransformersAdapter, "masks", spy)
    for _ in range(6):
        ids = mf.as_ids([rng.randrange(mf.PROMPT_VOCAB) for _ in range(300)] + _branching_prompt(rng))
        records = []
        gen = _tree(model, ids, 24, prompt_lookup_num_tokens=5, tree_width=16, cost_aware=False,
                    on_step=records.append)
        assert gen.new_tokens == mf.greedy(model, ids, 24)
        first = records[0]
        branched += bool(first.chosen) and not is_chain(_local(first))
    assert branched >= 3 and max(queries) <= 1 + 16, (branched, queries)


def _local(record):
    """A step record's chosen nodes' parents among them (-1: the root)."""
    tree, chosen = record.tree, record.chosen
    return [chosen.index(tree.parents[j]) if tree.parents[j] >= 0 else -1 for j in chosen]


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_tree_left_padded_prompt(arch):
    import torch

    import pld

    model = mf.tiny_model(arch)
    rng = random.Random(f"tree-pad-{arch}")
    for _ in range(6):
        prompt = _branching_prompt(rng)
        pad = rng.randint(1, 4)
        ids = torch.tensor([[mf.PAD] * pad + prompt])
        mask = torch.tensor([[0] * pad + [1] * len(prompt)])
        expected = mf.greedy(model, ids, 16, attention_mask=mask)
        gen = pld.generate(model, ids, attention_mask=mask, max_new_tokens=16, draft_tree=True,
                           eos_token_id=None)
        assert gen.new_tokens == expected


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_tree_with_logits_processors_and_scores(arch):
    """A processor that reads the ids (repetition penalty: each row must see
    its own node's prefix) and a row-wise one; scores as plain decoding's."""
    import torch
    from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    from pld import loop

    model = mf.tiny_model(arch)
    rng = random.Random(f"tree-proc-{arch}")
    for _ in range(6):
        ids = mf.as_ids(_branching_prompt(rng))
        with torch.no_grad():
            ref = model.generate(ids, do_sample=False, max_new_tokens=12, repetition_penalty=1.3,
                                 output_scores=True, return_dict_in_generate=True)
        expected = ref.sequences[0, ids.shape[1]:].tolist()
        procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3)])
        with torch.no_grad():
            gen = loop.run(model, ids, max_new_tokens=12, draft_tree=True, eos_token_id=None,
                           logits_processor=procs, output_scores=True, record_steps=True)
        assert gen.sequences[0, ids.shape[1]:].tolist() == expected
        assert len(gen.scores) == len(expected)
        for mine, theirs in zip(gen.scores, ref.scores):
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_tree_under_model_generate(arch, monkeypatch):
    """pld.enable(draft_tree=True): model.generate(prompt_lookup_num_tokens=k)
    runs tree steps, gives greedy's tokens and transformers' scores."""
    import torch

    import pld
    from pld.decoder import Decoder

    model = mf.tiny_model(arch)
    counter = mf.install_counter(monkeypatch)
    trees = []
    original = Decoder.propose

    def counting(self):
        plans = original(self)
        trees.append(sum(len(p.chosen) for p in plans))
        return plans

    monkeypatch.setattr(Decoder, "propose", counting)
    rng = random.Random(f"tree-hf-{arch}")
    for _ in range(6):
        ids = mf.as_ids(_branching_prompt(rng))
        with torch.no_grad():
            ref = model.generate(ids, do_sample=False, max_new_tokens=20, output_scores=True,
                                 return_dict_in_generate=True)
        with torch.no_grad(), pld.enabled(draft_tree=True):
            out = model.generate(ids, do_sample=False, max_new_tokens=20, prompt_lookup_num_tokens=6,
                                 output_scores=True, return_dict_in_generate=True)
        assert out.sequences.tolist() == ref.sequences.tolist()
        assert len(out.scores) == len(ref.scores)
        for mine, theirs in zip(out.scores, ref.scores):
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    assert counter.calls == 6
    assert sum(w > 0 for w in trees) >= 6  # trees were verified


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_tree_seeded_sampling_repeats(arch):
    import torch

    import pld

    model = mf.tiny_model(arch)
    rng = random.Random(f"tree-seed-{arch}")
    for seed in range(4):
        ids = mf.as_ids(_branching_prompt(rng))
        runs = []
        for _ in range(2):
            torch.manual_seed(seed)
            runs.append(pld.generate(model, ids, max_new_tokens=20, draft_tree=True, do_sample=True,
                                     temperature=1.3, eos_token_id=None).new_tokens)
        assert runs[0] == runs[1] and len(runs[0]) == 20


def test_tree_falls_back_to_linear_drafts_on_a_cache_without_keep_last(caplog):
    import torch
    from transformers import DynamicCache

    from pld import loop

    caplog.set_level(logging.INFO, logger="pld")
    model = mf.tiny_model("llama")
    ids = mf.as_ids(mf.repeated_prompt(random.Random("fallback")))
    with torch.no_grad():
        got = loop.run(model, ids, max_new_tokens=16, draft_tree=True, cache=DynamicCache())
    assert got.sequences[0, ids.shape[1]:].tolist() == mf.greedy(model, ids, 16)
    assert any("linear drafts instead of a token tree" in r.getMessage() for r in caplog.records)


def test_decide_keeps_a_tree_only_where_it_can_be_verified_exactly(caplog):
    import logging

    import torch
    from transformers import DynamicCache

    from pld.config import DecodeConfig
    from pld.hf_adapter import decide, masks_blocker
    from pld.kv_cache import OwnedCache

    model = mf.tiny_model("llama")
    ids = torch.tensor([[1, 2, 3]])
    config = DecodeConfig(draft_tree=True, eos_token_id=None)
    assert decide(model, ids, config, True, cache=OwnedCache()).config.draft_tree
    with caplog.at_level(logging.WARNING, logger="pld"):
        linear = decide(model, ids, config, True, cache=DynamicCache()).config
    assert not linear.draft_tree and "cannot keep a tree's accepted path" in caplog.text

    class Flash:
        class config:
            _attn_implementation = "flash_attention_2"

    assert "flash_attention_2" in masks_blocker(Flash())


# -- the parts -----------------------------------------------------------------

def _tree_of(tokens, parents, depths, ngrams=None, supports=None):
    from pld.token_tree import TokenTree

    n = len(tokens)
    return TokenTree(list(tokens), list(parents), list(depths), list(ngrams or [3] * n),
                     list(supports or [1] * n))


def test_choose_is_ancestor_closed_and_follows_the_cost():
    from pld.forward_cost import ForwardCost
    from pld.token_tree import choose_rows

    def choose(reach, cost, pending, max_width):  # one row
        return choose_rows([reach], cost, pending, max_width)[0]

    reach = [0.9, 0.8, 0.1, 0.7, 0.05]  # 0 -> 1 -> 3 (likely), 0 -> 2, 1 -> 4
    flat = ForwardCost([1, 64], [1.0, 1.0])
    assert choose(reach, flat, 1, 10) == [0, 1, 2, 3, 4]
    assert choose(reach, flat, 1, 3) == [0, 1, 3]
    steep = ForwardCost([1, 2, 3], [1.0, 2.0, 3.0])  # each token costs a forward: never pays
    assert choose(reach, steep, 1, 10) == []
    cpu = ForwardCost([1, 2, 4, 8], [1.0, 1.1, 1.2, 1.5])
    chosen = choose(reach, cpu, 1, 10)
    assert chosen == [0, 1, 3]  # the likely chain; the unlikely nodes do not pay
    assert choose([], cpu, 1, 10) == []


def test_reach_is_the_product_along_the_path_and_siblings_share_at_most_one():
    from pld.token_tree import ROW, UNKNOWN, AcceptanceModel

    tree = _tree_of([5, 6, 7, 8], [-1, 0, 0, -1], [1, 2, 2, 1], ngrams=[3, 3, 3, 3],
                    supports=[3, 3, 3, 3])
    prior = tuple(tuple(((0.9,) * 4,) * 5 for _ in range(3)) for _ in range(4))
    model = AcceptanceModel(prior=prior)
    reach = model.reach(tree)
    assert reach[0] + reach[3] == pytest.approx(1.0)  # two root children at 0.9 each: scaled
    assert reach[1] == pytest.approx(reach[0] * 0.5)
    model.update(tree, [0, 1, 2, 3], [0, 2])  # root children and 0's children were trials
    assert model.trials[(3, 2, 0, UNKNOWN, ROW)] == pytest.approx(4.0 + 2)
    assert model.hits[(3, 2, 0, UNKNOWN, ROW)] == pytest.approx(0.9 * 4 + 1)
    assert model.hits[(3, 2, 1, UNKNOWN, ROW)] == pytest.approx(0.9 * 4 + 1)


def test_optimism_adds_posterior_deviations_that_shrink_with_trials():
    """rate(..., optimism=z) is the Beta posterior's mean plus z standard
    deviations: sqrt(m (1 - m) / (n + 1)) for n pseudo-counts. More trials
    at the same rate make it less hopeful; it never passes MAX_PROBABILITY
    and leaves the counts as they were."""
    import math

    from pld.token_tree import MAX_PROBABILITY, ROW, UNKNOWN, AcceptanceModel

    prior = tuple(tuple(((0.1,) * 4,) * 5 for _ in range(3)) for _ in range(4))
    model = AcceptanceModel(prior=prior, prior_weight=4.0)
    assert model.rate(1, 1, 1) == pytest.approx(0.1)
    assert model.rate(1, 1, 1, optimism=1.0) == pytest.approx(0.1 + math.sqrt(0.09 / 5))
    assert model.rate(1, 1, 1, optimism=2.0) == pytest.approx(0.1 + 2 * math.sqrt(0.09 / 5))
    b = (1, 0, 0, UNKNOWN, ROW)
    model.trials[b] += 20.0
    model.hits[b] += 2.0  # 2.4 hits in 24: the same mean, more certain
    assert model.rate(1, 1, 1) == pytest.approx(0.1)
    assert model.rate(1, 1, 1, optimism=1.0) == pytest.approx(0.1 + math.sqrt(0.09 / 25))
    assert model.rate(1, 1, 1, optimism=100.0) == MAX_PROBABILITY
    tree = _tree_of([5, 6, 7], [-1, 0, -1], [1, 2, 1], ngrams=[1, 1, 2], supports=[1, 1, 1])
    mean = model.reach(tree)
    hopeful = model.reach(tree, optimism=1.0)
    assert all(h > m for h, m in zip(hopeful, mean))
    assert model.reach(tree) == mean and model.trials[b] == 24.0


def test_the_budget_explores_a_bucket_whose_mean_does_not_pay():
    """A tree step chooses its nodes on hopeful rates (EXPLORATION) and
    counts its prediction on the mean ones: a node whose mean rate does not
    pay for its forward, but whose hopeful rate does, is verified, and the
    step's predicted total is the chosen nodes' mean reach."""
    import torch

    from pld import width_budget
    from pld.forward_cost import ForwardCost
    from pld.token_tree import AcceptanceModel, choose_rows
    from test_tree_successors import _decoder

    assert width_budget.EXPLORATION > 0
    prior = tuple(tuple(((0.1,) * 4,) * 5 for _ in range(3)) for _ in range(4))
    model = mf.sharp_model(mf.ARCHS[0])
    rng = random.Random("explore")
    while True:  # a prompt holding the model's first token: the next step has candidates
        prompt = [rng.randrange(mf.PROMPT_VOCAB) for _ in range(12)]
        if mf.greedy(model, mf.as_ids(prompt), 1)[0] in prompt:
            break
    ids = mf.as_ids(prompt)
    adapter, decoder = _decoder(model, ids, max_new_tokens=8, tree_successors=False)
    cost = ForwardCost([1, 2, 64], [1.0, 1.15, 2.0])  # the first node must bring 0.15
    decoder.cost = cost
    with torch.no_grad(), adapter.kernels():
        decoder.step()  # the prefill (no budget)
        decoder.acceptance = AcceptanceModel(prior=prior)  # the prior's rates, nothing learnt
        (plan,) = decoder.propose()
    tree, chosen = plan.tree, plan.chosen
    assert chosen  # hopeful: sqrt(0.09 / 5) = 0.13 more
    acceptance = decoder.acceptance
    mean = acceptance.scaled(acceptance.reach(tree))
    assert max(mean) < 0.15 and choose_rows([mean], cost, 1, 32) == [[]]
    assert plan.predicted == pytest.approx(sum(acceptance.reach(tree)[j] for j in chosen))


def test_agreement_picks_the_bucket_a_node_is_scored_and_counted_in():
    """A node the model's successors agree with is scored by its
    agreement's rate, and counted there."""
    from pld.token_tree import DISAGREES, PAIR_AGREES, ROW, TOKEN_AGREES, UNKNOWN, AcceptanceModel

    rates = {PAIR_AGREES: 0.8, TOKEN_AGREES: 0.4, DISAGREES: 0.1, UNKNOWN: 0.3}
    prior = tuple(tuple((tuple(rates[a] for a in range(4)),) * 5 for _ in range(3))
                  for _ in range(4))
    model = AcceptanceModel(prior=prior)
    tree = _tree_of([5, 6, 7], [-1, 0, -1], [1, 2, 1], ngrams=[1, 1, 2], supports=[1, 1, 1])
    assert model.reach(tree) == pytest.approx([0.3, 0.09, 0.3])  # no agreement known
    tree.agreement = [PAIR_AGREES, DISAGREES, TOKEN_AGREES]
    assert model.reach(tree) == pytest.approx([0.8 / 1.2, 0.8 / 1.2 * 0.1, 0.4 / 1.2])
    model.update(tree, [0, 1, 2], [0])
    assert model.hits[(1, 0, 0, PAIR_AGREES, ROW)] == pytest.approx(0.8 * 4 + 1)
    assert model.trials[(1, 0, 1, DISAGREES, ROW)] == pytest.approx(4 + 1)
    assert model.hits[(1, 0, 1, DISAGREES, ROW)] == pytest.approx(0.1 * 4)
    assert model.trials[(2, 0, 0, TOKEN_AGREES, ROW)] == pytest.approx(4 + 1)
    assert model.trials[(1, 0, 0, UNKNOWN, ROW)] == pytest.approx(4)  # untouched


def test_each_origin_learns_its_own_buckets_and_merge_keeps_the_first_origin():
    """Nodes found in a sibling row or a corpus start from the same prior as
    the row's own, and learn apart: a corpus node's misses leave the row's
    bucket as it was. A merged node keeps the origin of the tree it was in
    first; new nodes bring theirs."""
    from pld.token_tree import CORPUS, ROW, SIBLING, UNKNOWN, AcceptanceModel, merge, origins_of, with_origin

    prior = tuple(tuple(((0.5,) * 4,) * 5 for _ in range(3)) for _ in range(4))
    model = AcceptanceModel(prior=prior)
    row = _tree_of([5, 6], [-1, 0], [1, 2], ngrams=[2, 2], supports=[1, 1])
    corpus = with_origin(_tree_of([5, 7, 8], [-1, 0, -1], [1, 2, 1], ngrams=[2, 2, 2], supports=[1, 1, 1]),
                         CORPUS)
    tree = merge(row, corpus)
    assert tree.tokens == [5, 6, 7, 8] and origins_of(tree) == [ROW, ROW, CORPUS, CORPUS]
    assert model.reach(tree)[2] == pytest.approx(model.reach(tree)[1])  # one prior for all
    for _ in range(10):
        model.update(tree, [0, 1, 2, 3], [0, 1])  # the corpus nodes always miss
    assert model.rate(2, 1, 2, origin=CORPUS) < 0.2 < 0.8 < model.rate(2, 1, 2, origin=ROW)
    assert model.trials[(2, 0, 0, UNKNOWN, SIBLING)] == pytest.approx(4.0)  # untouched
    hits, trials = model.counts(CORPUS)
    assert trials[(2, 0, 0, UNKNOWN)] == pytest.approx(4.0 + 10) and hits[(2, 0, 0, UNKNOWN)] == pytest.approx(2.0)


def test_a_tree_forward_sees_context_ancestors_and_self():
    """The decoder's mask of a tree step (pld.decoder: the row's valid
    cached slots, then block_visibility over the new tokens, made additive
    by pld.attention_masks.layer_masks)."""
    import torch

    from pld.attention_masks import layer_masks
    from pld.token_tree import block_visibility

    cached = torch.tensor([False, True, True])  # one padded column
    block = block_visibility([-1, 0, -1, 2, 1], 5)
    allowed = torch.cat([cached[None].expand(6, 3), block], dim=1)[None]
    keys, queries = torch.arange(9)[None], torch.arange(3, 9)[None]
    mask = layer_masks(allowed, keys, queries, [("full_attention", None)], torch.float32)
    assert mask.shape == (1, 1, 6, 9)
    seen = (mask[0, 0] == 0).int().tolist()
    assert seen == [
        [0, 1, 1, 1, 0, 0, 0, 0, 0],   # the pending token: the context, causal
        [0, 1, 1, 1, 1, 0, 0, 0, 0],   # node 0
        [0, 1, 1, 1, 1, 1, 0, 0, 0],   # node 1 (child of 0)
        [0, 1, 1, 1, 0, 0, 1, 0, 0],   # node 2 (a root)
        [0, 1, 1, 1, 0, 0, 1, 1, 0],   # node 3 (child of 2)
        [0, 1, 1, 1, 1, 1, 0, 0, 1],   # node 4 (child of 1)
    ]
    assert mask.min() == torch.finfo(torch.float32).min


def test_walk_descends_while_the_model_agrees():
    from pld.token_tree import walk

    tree = _tree_of([5, 6, 7, 8], [-1, 0, 0, -1], [1, 2, 2, 1])
    model_tokens = {0: 5, 1: 7, 3: 9}  # row -> the model's token: 5, then 7, then 9
    path, tokens = walk(tree, [0, 1, 2, 3], lambda row: model_tokens[row])
    assert path == [0, 2] and tokens == [5, 7, 9]
    path, tokens = walk(tree, [0, 3], lambda row: {0: 8, 2: 1}[row])
    assert path == [1] and tokens == [8, 1]


def test_forward_cost_table():
    from pld.forward_cost import ForwardCost, size_class, time_widths

    cost = ForwardCost([1, 4, 8], [2.0, 3.0, 2.5])  # a noisy dip is flattened
    assert cost(1) == 1.0 and cost(4) == 1.5 and cost(8) == 1.5
    assert cost(2) == pytest.approx(1 + 0.5 / 3)
    assert cost(16) == pytest.approx(1.5)  # past the end: the last slope (0)
    assert ForwardCost([1, 2], [1.0, 2.0])(5) == pytest.approx(5.0)
    for widths, seconds in (([2, 4], [1.0, 1.0]), ([1, 1], [1.0, 1.0]), ([1, 2], [1.0, 0.0]),
                            ([1], [1.0, 2.0])):
        with pytest.raises(ValueError):
            ForwardCost(widths, seconds)
    ticks = iter(range(1000))
    calls = []
    assert time_widths(calls.append, (1, 2, 4), clock=lambda: next(ticks)) == [1.0, 1.0, 1.0]
    assert calls == [1, 2, 4]  # each width once, in order, no untimed call
    assert [size_class(n) for n in (0, 255, 256, 1023, 1024, 5000)] == [0, 0, 1, 1, 2, 3]


def test_tree_options_are_validated():
    from pld.config import DecodeConfig

    with pytest.raises(ValueError, match="tree_width"):
        DecodeConfig(tree_width=0)
    with pytest.raises(ValueError, match="tree_width"):
        DecodeConfig(tree_width=5000)
    with pytest.raises(ValueError, match="tree_candidates"):
        DecodeConfig(tree_candidates=17)
    with pytest.raises(TypeError, match="draft_tree"):
        DecodeConfig(draft_tree=1)
    with pytest.raises(TypeError, match="tree_successors"):
        DecodeConfig(tree_successors="yes")


def test_tree_prior_fit_shrinks_toward_smaller_neighbours():
    from pld.bench.tree_prior import fitted
    from pld.token_tree import UNKNOWN as U
    from pld.token_tree import AcceptanceModel

    counts = AcceptanceModel(prior_weight=0.0)
    counts.trials[(1, 0, 0, U, 0)], counts.hits[(1, 0, 0, U, 0)] = 1000.0, 100.0   # well observed: 0.1
    counts.trials[(1, 1, 0, U, 0)], counts.hits[(1, 1, 0, U, 0)] = 2.0, 2.0        # two hits only
    counts.trials[(0, 0, 0, U, 0)], counts.hits[(0, 0, 0, U, 0)] = 1000.0, 300.0   # successors: 0.3
    prior, lines = fitted(counts, strength=10.0)
    assert prior[1][0][0][U] == pytest.approx((100 + 10 * 0.1) / 1010, abs=0.01)
    # few trials: pulled from 1.0 toward its smaller neighbour's 0.1
    assert prior[1][1][0][U] == pytest.approx((2 + 10 * 0.1) / 12, abs=0.01)
    # no trials at all: the largest smaller neighbour's rate
    assert prior[1][0][1][U] == prior[1][0][0][U]
    assert prior[2][1][0][U] == max(prior[1][1][0][U], prior[2][0][0][U])
    # the successors' row is no smaller n-gram: 1-grams never borrow from
    # it, and its empty buckets take the row's own pooled rate
    assert prior[1][0][0][U] < 0.2
    assert prior[0][2][4][U] == pytest.approx(0.3, abs=0.01)
    assert len(prior) == 4 and all(len(s) == 3 and len(s[0]) == 5 and len(s[0][0]) == 4
                                   for s in prior)
    assert any("observed" in line for line in lines)


def test_tree_prior_fit_pools_agreements_then_shrinks_each_toward_the_pool():
    from pld.bench.tree_prior import fitted
    from pld.token_tree import DISAGREES, PAIR_AGREES, UNKNOWN, AcceptanceModel

    counts = AcceptanceModel(prior_weight=0.0)
    counts.trials[(1, 0, 0, PAIR_AGREES, 0)], counts.hits[(1, 0, 0, PAIR_AGREES, 0)] = 100.0, 80.0
    counts.trials[(1, 0, 0, DISAGREES, 0)], counts.hits[(1, 0, 0, DISAGREES, 0)] = 900.0, 20.0
    prior, _ = fitted(counts, strength=10.0)
    pool = (100 + 10 * 0.1) / 1010  # 100 hits in 1000 trials, shrunk toward the overall 0.1
    row = prior[1][0][0]
    assert row[UNKNOWN] == pytest.approx(pool, abs=0.01)
    assert row[PAIR_AGREES] == pytest.approx((80 + 10 * pool) / 110, abs=0.01)
    assert row[DISAGREES] == pytest.approx((20 + 10 * pool) / 910, abs=0.01)
    assert row[1] == pytest.approx(pool, abs=0.01)  # no trials: the pool's
