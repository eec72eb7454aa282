"""The draft lengths pld's vLLM drafter sends (pld.vllm_budget.StepBudget):
drafts that pay for the time they add to vLLM's step, both learned while
serving. Driven with a fake clock whose step time grows with the step's
draft tokens, so the tests are deterministic. No vLLM, no model."""
from __future__ import annotations

import types

import numpy as np
import pytest

from pld.acceptance_buckets import CORPUS, ROW
from pld.token_tree import AcceptanceModel
from pld.vllm import Drafter
from pld.vllm_budget import PLAIN_EVERY, StepBudget, size_class
from pld.width_budget import EXPLORE_EVERY

from test_vllm_drafter import config


class StepClock:
    """Time that passes as vLLM's steps would: a step with w - 1 draft
    tokens takes 1 + slope * (w - 1)."""

    def __init__(self, slope: float) -> None:
        self.t, self.slope = 0.0, slope

    def __call__(self) -> float:
        return self.t

    def run_step(self, draft_tokens: int) -> None:
        self.t += 1.0 + self.slope * draft_tokens


def serve(slope: float, steps: int, accept, k: int = 8, rows: int = 1):
    """A budget over ``rows`` chains of k tokens (3-gram matches) a step,
    ``accept(j)`` of each j-token draft kept; the lengths chosen."""
    clock = StepClock(slope)
    budget = StepBudget(k, clock=clock)
    candidate = (ROW, 3, 1, k)
    chosen = []
    for _ in range(steps):
        out = budget.choose([candidate] * rows, rows, same_rows=True)
        clock.run_step(sum(d for d, _ in out))
        for d, predicted in out:
            if d:
                budget.accepted(candidate, d, accept(d), predicted)
        chosen.append([d for d, _ in out])
    return budget, chosen


def test_cheap_steps_draft_everything_and_dear_ones_only_what_pays():
    five = lambda d: min(d, 5)  # noqa: E731 - the text copies 5 tokens, then differs
    _, cheap = serve(0.01, 300, five)
    _, dear = serve(0.6, 300, five)
    cheap_late = [sum(c) for c in cheap[200:]]
    dear_late = [sum(c) for c in dear[200:]]
    assert np.median(cheap_late) == 8
    assert 0 < np.median(dear_late) < 8


def test_the_learned_cost_follows_the_clock():
    budget, _ = serve(0.25, 200, lambda d: d)
    cost = budget.cost(size_class(1))
    assert cost(1) == 1.0
    assert cost(9) == pytest.approx(1 + 0.25 * 8, rel=0.05)


def test_rejected_drafts_stop_and_are_tried_again():
    _, chosen = serve(0.1, 300, lambda d: 0)
    late = [c[0] for c in chosen[100:]]
    assert sum(1 for d in late if d) <= len(late) // 8  # mostly no draft
    assert any(late)  # but tried again now and then


def test_a_step_without_drafts_every_plain_every_steps_under_a_learned_cost():
    _, chosen = serve(0.001, 3 * PLAIN_EVERY + 2, lambda d: d)
    plain = [i for i, c in enumerate(chosen) if not c[0]]
    assert plain[0] == 0  # the first step measures the unit
    assert all(b - a <= PLAIN_EVERY + 1 for a, b in zip(plain, plain[1:]))
    assert len(plain) >= 3


def test_a_fixed_cost_reads_no_clock_and_drafts_every_step_that_pays():
    budget = StepBudget(4, verify_cost=0.01, clock=None)
    candidate = (ROW, 3, 1, 4)
    for _ in range(2 * PLAIN_EVERY):
        (d, _), = budget.choose([candidate], 1, same_rows=True)
        assert d == 4
        budget.accepted(candidate, d, d, 3.0)


def test_exploration_after_idle_steps():
    budget = StepBudget(4, verify_cost=100.0)  # nothing ever pays
    candidate = (ROW, 1, 1, 4)
    lengths = [budget.choose([candidate, None], 1)[0][0] for _ in range(EXPLORE_EVERY)]
    assert lengths == [0] * (EXPLORE_EVERY - 1) + [1]


def test_the_batch_shares_one_forward_likeliest_tokens_first():
    budget = StepBudget(6, verify_cost=0.1)
    strong, weak = (ROW, 3, 3, 6), (ROW, 1, 1, 6)
    (ds, ps), (dw, pw), (dn, pn) = budget.choose([strong, weak, None], 2)
    assert ds > dw and dn == 0 and pn == 0.0
    assert ps > pw >= 0.0
    reach = budget.reach(*strong[:3])
    assert ps == pytest.approx(sum(reach[:ds]))


def test_observe_chain_counts_trials_up_to_the_first_rejection():
    model = AcceptanceModel()
    before = model.counts()
    model.observe_chain(2, 1, proposed=5, accepted=2)
    hits, trials = model.counts()
    added_trials = {b: trials[b] - before[1][b] for b in trials if trials[b] != before[1][b]}
    added_hits = {b: hits[b] - before[0][b] for b in hits if hits[b] != before[0][b]}
    assert sum(added_trials.values()) == 3 and sum(added_hits.values()) == 2


def test_the_drafter_drafts_less_when_its_drafts_fail():
    """Through pld.vllm.Drafter: text that stops copying gets few drafts."""
    tokens = np.zeros((1, 400), dtype=np.int32)
    seq = [3, 4, 5, 6] * 10
    tokens[0, :len(seq)] = seq
    drafter = Drafter(config(k=8, max_model_len=400))
    clock = StepClock(0.1)
    drafter.budget.clock = clock
    sizes = []
    for step in range(120):  # every draft rejected: the next token is new
        draft = drafter.propose([[seq[-1]]], np.array([len(seq)]), tokens)[0]
        clock.run_step(len(draft))
        sizes.append(len(draft))
        seq.append(40 + step % 7)
        tokens[0, len(seq) - 1] = seq[-1]
    assert max(sizes[:30]) >= 4  # at first: the prior's drafts
    assert sum(sizes[60:]) < sum(sizes[:60]) / 2
    assert sum(1 for d in sizes[60:] if d) <= 60 // 8  # then mostly none: a token now and then


@pytest.mark.parametrize("bad", ["fast", -0.1, float("nan"), True, [0.1]])
def test_bad_verify_cost_is_refused(bad):
    with pytest.raises(ValueError, match="verify_cost"):
        Drafter(config(verify_cost=bad))


def test_verify_cost_learned_by_default_on_one_rank_fixed_on_several():
    assert Drafter(config()).options.verify_cost is None
    assert Drafter(config(tensor_parallel_size=4)).options.verify_cost == 0.05
    assert Drafter(config(tensor_parallel_size=4, verify_cost="learned")).options.verify_cost is None
    assert Drafter(config(verify_cost=0.2)).options.verify_cost == 0.2
    assert Drafter(config(adaptive=False)).budget is None


@pytest.mark.parametrize("slope", [0.0, 0.05, 0.2])
def test_at_one_row_a_bucket_drafts_what_pays_alone_whatever_the_plan_was_made_with(slope):
    # one row: a chain of any bucket, or a longer chain than the plan saw, is cut where it pays alone
    strong, weak, short = (ROW, 3, 1, 8), (ROW, 1, 1, 8), (ROW, 3, 1, 2)

    def first_plan(candidate):
        budget = StepBudget(8, verify_cost=slope)
        budget.choose([candidate], 1)
        return budget

    for made_with, then in ((strong, weak), (short, strong), (weak, strong)):
        assert first_plan(made_with).choose([then], 1) == first_plan(then).choose([then], 1)
    if slope < 0.2:  # (where drafts are cheap, longer than any chain the plan saw)
        assert first_plan(short).choose([strong], 1)[0][0] > 2


@pytest.mark.parametrize("rows", [1, 3])
def test_a_corpus_bucket_gets_a_plan_the_first_time_a_row_draws_on_it(rows):
    # corpus buckets are not planned until a row has one; where drafts cost nothing, one drafts its whole chain
    budget = StepBudget(10, verify_cost=0.0)
    assert budget.choose([(ROW, 2, 1, 4)] * rows, rows)[0][0] == 4
    got = budget.choose([(CORPUS, 3, 3, 6)] + [None] * (rows - 1), rows)
    assert got[0][0] == 6 and got[0][1] > 0
    assert got[1:] == [(0, 0.0)] * (rows - 1)


def test_a_step_is_timed_only_when_it_served_the_same_requests_as_the_last(monkeypatch):
    # the time from one call to the next is a sample of the step's cost unless a request arrived, left,
    # or was prefilled in between (the prefill's time is not a step's)
    tokens = np.zeros((3, 64), dtype=np.int32)
    drafter = Drafter(config(k=4, max_model_len=64))
    seen = []
    choose = drafter.budget.choose
    monkeypatch.setattr(drafter.budget, "choose", lambda c, rows, same: seen.append(same) or choose(c, rows, same))
    a, b, c = [1, 2, 3, 1, 2, 3], [4, 5, 6, 4, 5, 6], [7, 8, 9, 7, 8, 9]
    steps = [([a], [[1]]), ([a], [[2]]),  # one request, twice: the second is timed
             ([a, b], [[3], [4]]),  # a request arrived (prefilled in one step)
             ([a, b], [[1], [5]]),
             ([a, c[:4]], [[2], []]),  # row 1 gives way to a request being prefilled in chunks
             ([a, c], [[3], []]),
             ([a, c], [[1], [7]]),  # its first token
             ([a, c], [[2], [8]]),
             ([a], [[3]])]  # a request left
    for rows, sampled in steps:
        for i, (seq, new) in enumerate(zip(rows, sampled)):
            seq.extend(new)  # (each row grows by the ids sampled: a prefill's first one too)
            tokens[i, :len(seq)] = seq
        drafter.propose(sampled, np.array([len(seq) for seq in rows]), tokens)
    assert seen == [False, True, False, True, False, False, False, True, False]


def reference_plan(budget, candidates, rows, cost):
    """The plan's rule, eagerly, over every bucket: the rows' draft tokens
    likeliest first while (rows + reach) / c(1 + tokens) grows; then each
    bucket at least the depth that pays for a row of it in place of an
    average row of that plan. Returns {bucket: depth}."""
    k = budget.k
    groups = {(ROW, n, s) for n in range(1, 4) for s in range(1, 4)} | {c[:3] for c in candidates if c}
    reach = {g: budget.reach(*g) for g in groups}
    items = sorted(((reach[c[:3]][j], c[:3], j) for c in candidates if c for j in range(min(c[3], k))),
                   key=lambda t: -t[0])
    gained, width, best_rate, best, depth = float(rows), 1, rows / cost(1), (float(rows), 1), {}
    for r, group, j in items:
        gained, width = gained + r, width + 1
        if gained / cost(width) <= best_rate:
            break
        best_rate, best = gained / cost(width), (gained, width)
        depth[group] = max(depth.get(group, 0), j + 1)
    share = 1.0 - 1.0 / rows
    base_gained, base_width = best[0] * share + 1.0, 1 + (best[1] - 1) * share
    for group in groups:
        gained, rate, alone = base_gained, base_gained / cost(base_width), 0
        for j, r in enumerate(reach[group]):
            gained += r
            if gained / cost(base_width + j + 1) <= rate:
                break
            rate, alone = gained / cost(base_width + j + 1), j + 1
        depth[group] = max(depth.get(group, 0), alone)
    return depth


def test_every_bucket_gets_the_depth_of_the_plan_s_rule_whichever_is_asked_first():
    # the plan works a bucket's depth out when a row first draws on it: the same as the rule made eagerly
    for seed in range(80):
        rng = np.random.default_rng(seed)
        budget = StepBudget(8, verify_cost=float(rng.choice([0.0, 0.01, 0.03, 0.1, 0.3])))
        for _ in range(int(rng.integers(0, 300))):  # outcomes that set the buckets' rates apart
            c = (ROW, int(rng.integers(1, 4)), int(rng.integers(1, 4)), 8)
            proposed = int(rng.integers(1, 9))
            budget.accepted(c, proposed, int(rng.integers(0, proposed + 1)), float(rng.random() * 3))
        rows = int(rng.integers(1, 12))
        candidates = [(ROW, int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 9)))
                      if rng.random() < 0.8 else None for _ in range(rows)]
        budget.choose(candidates, rows)  # the plan, made with these rows
        expected = reference_plan(budget, candidates, rows, budget.cost(size_class(rows)))
        others = [(ROW, n, s, 8) for n in range(1, 4) for s in range(1, 4)]
        rng.shuffle(others)

        def depth(c):
            budget._idle, budget._plan_age = 0, 0  # (the same plan throughout; no exploration step)
            return budget.choose([c] + [None] * (rows - 1), rows)[0][0]

        for c in others:  # every bucket, in a random order, then the rows' own
            assert depth(c) == expected[c[:3]], (seed, c)
        for c in candidates:
            if c:
                assert depth(c) == min(c[3], expected[c[:3]]), (seed, c)


def test_observe_chain_count_is_count_chains_in_turn():
    one, many = AcceptanceModel(), AcceptanceModel()
    for _ in range(3):
        one.observe_chain(2, 3, proposed=6, accepted=4, predicted=1.5)
    many.observe_chain(2, 3, proposed=6, accepted=4, predicted=4.5, count=3)
    assert one.counts() == many.counts() and one.scale == pytest.approx(many.scale)


def test_a_plan_is_made_again_after_steps_that_draft_or_learn_and_rarely_over_others(monkeypatch):
    """A step counts whole towards the next plan where a row drafts, or
    has a match while answered drafts wait to be learned; any other step
    counts 1/IDLE_STEPS (a plan made then would learn nothing new about
    acceptance, only the step times)."""
    from pld.vllm_budget import IDLE_STEPS, REPLAN_EVERY

    plans, steps = [], []

    def budget_for(slope):
        budget = StepBudget(8, verify_cost=slope)
        replan = budget._replan
        monkeypatch.setattr(budget, "_replan", lambda *a: (plans.append(len(steps)), replan(*a)))
        return budget

    weak = (ROW, 1, 1, 8)
    budget = budget_for(0.0)  # every match drafted: a plan every REPLAN_EVERY steps
    for _ in range(3 * REPLAN_EVERY):
        (d, p), = budget.choose([weak], 1)
        assert d > 0
        budget.accepted(weak, d, 0, p)
        steps.append(1)
    assert plans == [0, REPLAN_EVERY, 2 * REPLAN_EVERY]

    del plans[:], steps[:]
    budget = budget_for(50.0)  # nothing pays: only the exploration steps draft
    assert budget.choose([weak], 1) == [(0, 0.0)] and plans == [0]
    steps.append(1)
    budget.accepted(weak, 1, 1, 0.1)  # an answered draft waits: the steps with a match count whole
    while len(plans) == 1 and len(steps) <= 2 * REPLAN_EVERY:
        budget.choose([weak], 1)
        steps.append(1)
    assert plans == [0, 1 + REPLAN_EVERY] and not budget.outcomes  # (step 0 had nothing to learn: 1/IDLE_STEPS)
    drafted = []
    for _ in range(8 * EXPLORE_EVERY):  # nothing answered now: 1/IDLE_STEPS a step, an exploration step whole
        drafted.append(budget.choose([weak], 1)[0][0])
        steps.append(1)
    assert sum(drafted) == len(drafted) // EXPLORE_EVERY  # (one token each)
    assert plans == [0, 1 + REPLAN_EVERY]

    del plans[:], steps[:]
    budget = budget_for(50.0)
    for _ in range(2 * REPLAN_EVERY * IDLE_STEPS + 1):  # nothing to draft: a plan every REPLAN_EVERY * IDLE_STEPS
        assert budget.choose([None], 1) == [(0, 0.0)]
        steps.append(0)
    assert plans == [0, REPLAN_EVERY * IDLE_STEPS, 2 * REPLAN_EVERY * IDLE_STEPS]
