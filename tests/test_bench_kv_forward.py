"""The KV-cache forward benchmark (python -m pld bench kv-forward) runs end to
end on the embedded model and reports both caches at every context."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.torch]


def test_kv_forward_benchmark_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pld.bench", "kv-forward", "--contexts", "16,40", "--reps", "2",
         "--threads", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())["results"]
    assert set(res) == {"16", "40"}
    for cell in res.values():
        assert cell["DynamicCache"] > 0 and cell["OwnedCache"] > 0 and cell["n"] == 2
    assert (tmp_path / "table.md").read_text().count("| 16 |") == 1
