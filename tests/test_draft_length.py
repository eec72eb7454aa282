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
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        DraftLength(k)
