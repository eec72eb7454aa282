"""The draft-length schedule (pld.draft_length.DraftLength): fixed by
default; adaptive grows after full acceptance, shrinks after rejections and
skips drafting for 1, 2, 4, ... steps after drafts that gained nothing."""
from __future__ import annotations

import pytest

from pld.draft_length import DraftLength


def test_fixed_length_ignores_outcomes():
    d = DraftLength(10)
    for proposed, accepted in [(10, 0), (10, 10), (3, 1), (0, 0)]:
        assert d.next() == 10
        d.update(proposed, accepted)
    assert d.next() == 10


def test_adaptive_shrinks_and_grows_within_bounds():
    d = DraftLength(6, adaptive=True)
    d.update(6, 3)                  # partly accepted: shorter
    assert d.next() == 5
    d.update(5, 5)                  # fully accepted: longer, capped at k
    assert d.next() == 6
    d.update(6, 6)
    assert d.next() == 6
    for _ in range(10):             # partial rejections never go below 1
        d.update(d.next(), 1) if d.length > 1 else d.update(1, 0)
    assert d.length == 1


def _skips_after_rejections(d: DraftLength, rounds: int):
    """Reject every draft; return the run lengths of no-draft steps."""
    runs, zeros = [], 0
    while len(runs) < rounds:
        k = d.next()
        if k == 0:
            zeros += 1
            continue
        if zeros:
            runs.append(zeros)
            zeros = 0
        d.update(k, 0)
    return runs


def test_adaptive_backs_off_exponentially_and_resets():
    d = DraftLength(10, adaptive=True, max_skip=8)
    d.update(10, 0)
    assert d.next() == 0            # one step without a draft
    assert d.next() > 0
    assert _skips_after_rejections(d, 5) == [2, 4, 8, 8, 8]
    k = d.next()
    while k == 0:                   # sit out the pending backoff
        k = d.next()
    d.update(k, 1)                  # a draft that gains a token resets the backoff
    k = d.next()
    assert k > 0
    d.update(k, 0)
    assert d.next() == 0 and d.next() > 0


def test_no_draft_steps_carry_no_information():
    d = DraftLength(4, adaptive=True)
    d.update(0, 0)
    assert d.next() == 4


@pytest.mark.parametrize("k", [0, -3])
def test_bad_length(k):
    with pytest.raises(ValueError, match="num_pred_tokens"):
        DraftLength(k)


def test_cost_gate_uses_priors_until_it_has_timings():
    from pld.draft_length import CostGate

    g = CostGate(3, prior_ratio=1.4)
    assert g.ratio == 1.4
    # priors (0.6 / 1.4 / 3.2 accepted tokens) against a threshold of 0.4
    assert g.allow(1) and g.allow(2) and g.allow(3)


def test_cost_gate_closes_small_matches_when_drafts_are_expensive():
    from pld.draft_length import CostGate

    g = CostGate(3, explore=5)
    g.update(0, 0, 0, 0.10)           # a plain step: 100 ms
    g.update(3, 10, 4, 0.20)          # a drafted step: 200 ms, so r = 2
    assert g.ratio == pytest.approx(2.0)
    assert g.allow(3)                 # 3-gram drafts gain more than a token
    assert not g.allow(1)             # 1-gram drafts (prior 0.6) do not
    # a closed size is let through every `explore` drafts, then closes again
    decisions = [g.allow(1) for _ in range(10)]
    assert decisions.count(True) == 2 and decisions[3] and decisions[8]


def test_cost_gate_opens_everything_when_drafts_are_cheap():
    from pld.draft_length import CostGate

    g = CostGate(3)
    g.update(0, 0, 0, 0.100)
    g.update(1, 10, 0, 0.105)         # GPU-like: r = 1.05
    assert all(g.allow(n) for n in (1, 2, 3))


def test_cost_gate_learns_from_accepted_tokens():
    from pld.draft_length import CostGate

    g = CostGate(2, prior_weight=4)
    g.update(0, 0, 0, 0.1)
    g.update(2, 5, 0, 0.2)
    assert not g.allow(1)
    for _ in range(12):               # 1-gram drafts start paying: 5 tokens each
        g.update(1, 10, 5, 0.2)
    assert g.gain(1) == pytest.approx((CostGate.PRIOR_GAIN[1] * 4 + 60) / 16)
    assert g.allow(1)
