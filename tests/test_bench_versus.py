"""The build-against-build benchmark (python -m pld bench versus): its table
arithmetic, its checks on the builds, and a tiny run end to end with this
tree as both builds (two workers, the same pld: outputs must be identical)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import pld
from pld.bench import versus

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(pld.__file__)))


def _bench(tmp_path, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pld.bench", "versus", *argv, "--out", str(tmp_path),
                           "--no-progress"], capture_output=True, text=True, timeout=timeout)


def _row(unit, build, tokens, seconds, forwards=4, method="pld"):
    return {"unit": unit, "method": method, "build": build, "tokens": tokens, "seconds": seconds,
            "new_tokens": sum(map(len, tokens)), "forward_calls": forwards}


def test_left_padded_pads_on_the_left_with_a_matching_mask():
    ids, mask = versus.left_padded([[5, 6, 7], [8]], pad=0)
    assert ids == [[5, 6, 7], [0, 0, 8]]
    assert mask == [[1, 1, 1], [0, 0, 1]]


def test_summarize_pools_rates_and_counts_identical_outputs():
    rows = [_row("a", "current", [[1, 2, 3, 4]], 1.0), _row("a", "baseline", [[1, 2, 3, 4]], 2.0),
            _row("b", "current", [[1, 2], [3, 4]], 1.0, forwards=2),
            _row("b", "baseline", [[1, 2], [3, 5]], 1.0, forwards=2),
            _row("c", "current", [[9]], 1.0)]  # one build only: left out
    (s,) = versus.summarize(rows, ["pld", "pld_tree"])
    assert s["runs"] == 2 and s["prompts"] == 3 and s["identical"] == 2
    assert s["tokens_per_second"] == {"current": 8 / 2, "baseline": 8 / 3}
    assert s["pooled_ratio"] == pytest.approx(1.5)
    assert (s["min_ratio"], s["median_ratio"], s["max_ratio"]) == (1.0, 1.5, 2.0)
    assert s["tokens_per_forward"]["current"] == pytest.approx(8 / (4 + 2 * 2))
    assert s["calibrated"] == {"current": 0, "baseline": 0}
    table = versus.markdown([s])
    assert "| pld | 2 | 4.00 | 2.67 | 1.500x | 1.500x (1.00-2.00) | 1.00 | 1.00 | 2/3 | 0/0 |" in table


def test_summarize_leaves_calibration_time_out():
    rows = [_row("a", "current", [[1, 2, 3, 4]], 3.0), _row("a", "baseline", [[1, 2, 3, 4]], 1.0)]
    rows[0].update(calibration_forwards=12, calibration_seconds=2.0)
    (s,) = versus.summarize(rows, ["pld"])
    assert s["pooled_ratio"] == pytest.approx(1.0)
    assert s["calibrated"] == {"current": 1, "baseline": 0}
    (paid,) = versus.summarize(rows, ["pld"], count_calibration=True)  # what a user pays
    assert paid["pooled_ratio"] == pytest.approx(1 / 3) and paid["median_ratio"] == pytest.approx(1 / 3)


def test_a_baseline_without_its_extension_is_refused(tmp_path):
    (tmp_path / "pld").mkdir()
    (tmp_path / "pld" / "__init__.py").write_text("")
    with pytest.raises(SystemExit, match="build_ext --inplace"):
        versus.build_root(str(tmp_path))
    with pytest.raises(SystemExit, match="no pld/__init__.py"):
        versus.build_root(str(tmp_path / "elsewhere"))


@pytest.mark.torch
def test_a_worker_that_imports_another_pld_stops_the_run(tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "pld").symlink_to(os.path.join(ROOT, "pld"))  # imports from ROOT/pld under another root
    proc = _bench(tmp_path / "out", "--baseline", str(fake), "--tasks", "code", "--limit", "1")
    assert proc.returncode != 0
    assert "the baseline worker imported pld from" in proc.stderr + proc.stdout


@pytest.mark.torch
def test_versus_runs_this_tree_against_itself(tmp_path):
    proc = _bench(tmp_path, "--baseline", ROOT, "--tasks", "code", "--limit", "1", "--max-new-tokens", "8",
                  "--methods", "pld", "--threads", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "versus_table.md").read_text()
    assert table in proc.stdout and "WARNING" not in table
    (line,) = [t for t in table.splitlines() if t.startswith("| pld |")]
    assert [c.strip() for c in line.strip("|").split("|")][-2] == "1/1"  # identical outputs
    assert f"current: {ROOT} @" in table and f"baseline: {ROOT} @" in table
    rows = [json.loads(t) for t in (tmp_path / "versus_results.jsonl").read_text().splitlines()]
    assert sorted(r["build"] for r in rows) == ["baseline", "current"]
    assert rows[0]["tokens"] == rows[1]["tokens"] and 0 < rows[0]["new_tokens"] <= 8
    assert all(r["forward_calls"] >= 1 for r in rows)
