"""The KV-cache forward benchmark (python -m pld bench kv-forward) runs end to
end on the embedded model and reports both caches at every context."""

from __future__ import annotations

import pytest

from bench_runner import run_bench

pytestmark = [pytest.mark.torch]


def test_kv_forward_benchmark_runs(tmp_path):
    res = run_bench(tmp_path, "kv-forward", "--contexts", "16,40", "--reps", "2",
                    "--threads", "1")["results"]
    assert set(res) == {"16", "40"}
    for cell in res.values():
        assert cell["DynamicCache"] > 0 and cell["OwnedCache"] > 0 and cell["n"] == 2
    assert (tmp_path / "table.md").read_text().count("| 16 |") == 1
