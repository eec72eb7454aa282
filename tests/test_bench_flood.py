"""The hash-flooding benchmark (python -m pld.bench flood) runs end to end and
reports every cell; its crafted ids share one home under key 0."""

from __future__ import annotations

import pld
from bench_runner import run_bench
from pld.bench.flood import crafted_ids, random_ids


def test_crafted_ids_share_one_home_under_key_0_only():
    ids = crafted_ids(500)
    assert len(set(ids)) == 500 and min(ids) >= 1 << 20
    assert {pld._core._ngram_tag([x], 0) & 0xFFFF for x in ids} == {0}
    assert len({pld._core._ngram_tag([x], 7) & 0xFFFF for x in ids}) > 400
    assert min(random_ids(100)) >= 1 << 20


def test_flood_benchmark_runs(tmp_path):
    out = run_bench(tmp_path, "flood", "--count", "500", "--repeats", "1",
                    "--policies", "first,recent")
    assert "criterion: crafted within 5x" in out["_stdout"]
    res = out["results"]
    assert set(res) == {"first", "recent"}
    for cells in res.values():
        assert set(cells) == {"keyed (random)", "key 0"}
        for c in cells.values():
            assert c["random"] > 0 and c["crafted"] > 0
            assert abs(c["ratio"] - c["crafted"] / c["random"]) < 1e-9
    table = (tmp_path / "table.md").read_text()
    assert table.count("| first |") == 2 and table.count("| recent |") == 2


def test_crafted_ids_are_distinct_up_to_their_bound():
    import pytest

    from pld.bench.flood import MAX_CRAFTED

    assert len(set(crafted_ids(MAX_CRAFTED))) == MAX_CRAFTED
    with pytest.raises(ValueError, match="--count: at most"):
        crafted_ids(MAX_CRAFTED + 1)


def test_no_policy_is_refused(capsys):
    import argparse

    from pld.bench.flood import _policies

    assert _policies(argparse.Namespace(count=10, repeats=1, policies=" , ")) is None
    assert "--policies: unknown ' , '" in capsys.readouterr().out
