"""`python -m pld demo`: plain and pld runs alternate, the speedup is the
median of the pairs with its spread, and a machine too busy to tell is
said to be (the A/A spread of the plain runs, or pairs that disagree)."""
from __future__ import annotations

import pytest

from pld.bench import demo


def test_the_verdict_is_the_median_of_the_pairs_with_the_plain_runs_spread():
    v = demo.verdict([10.0, 10.2, 9.9], [5.0, 4.0, 5.1], n_plain=100, n_lookup=100)
    assert v["pairs"] == 3
    assert v["median"] == pytest.approx(10.0 / 5.0) and v["min"] == pytest.approx(9.9 / 5.1)
    assert v["max"] == pytest.approx(10.2 / 4.0)
    assert v["spread"] == pytest.approx(0.3 / 10.0) and not v["noisy"]


def test_a_busy_machine_or_disagreeing_pairs_are_too_noisy_to_tell():
    busy = demo.verdict([10.0, 14.0, 10.0], [5.0, 5.0, 5.0], 100, 100)
    assert busy["spread"] == pytest.approx(0.4) and busy["noisy"]
    torn = demo.verdict([10.0, 10.0], [9.0, 11.0], 100, 100)
    assert torn["spread"] == 0.0 and torn["noisy"]  # one pair faster, one slower
    assert not demo.verdict([10.0], [5.0], 100, 100)["noisy"]


def test_the_runs_alternate_which_goes_first():
    order = []
    plains, lookups = demo.alternating(lambda: order.append("plain") or "p", lambda: order.append("pld") or "l", 3)
    assert order == ["plain", "pld", "pld", "plain", "plain", "pld"]
    assert [o for o, _ in plains] == ["p"] * 3 and [o for o, _ in lookups] == ["l"] * 3


@pytest.mark.torch
def test_the_demo_reports_the_median_of_alternating_pairs(capsys):
    assert demo.main(["--max-new-tokens", "24", "--repeats", "2", "--color", "plain"]) == 0
    out = capsys.readouterr().out
    assert "identical text:        yes" in out
    assert "(median of 2)" in out
    assert "median of 2 alternating pairs" in out and "plain runs" in out
    with pytest.raises(SystemExit, match="2"):  # argparse's usage error, before the model loads
        demo.main(["--max-new-tokens", "4", "--repeats", "0"])
    assert "--repeats: expected an integer >= 1, got 0" in capsys.readouterr().err


def test_drafts_offers_the_sources_the_demo_can_show(capsys):
    """"corpus" drafts from earlier calls' outputs, and the demo makes one: not offered."""
    from pld.drafts import REGISTRY

    parser = demo._parser()
    assert parser.parse_args(["--drafts", "siblings"]).drafts == "siblings"
    assert "corpus" in REGISTRY
    with pytest.raises(SystemExit):
        parser.parse_args(["--drafts", "corpus"])
    assert "--drafts: expected 'linear', 'tree' or sources from" in capsys.readouterr().err
    parser.print_help()
    assert "corpus:" not in capsys.readouterr().out
