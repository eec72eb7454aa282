"""The notebooks run clean, headless (nbclient), on the embedded model with a
tiny budget, and are committed without outputs."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
#: Run here; serving_with_vllm.ipynb needs vLLM and runs in CI's vLLM stage
#: (tests/vllm_engine/test_vllm_notebook.py).
RUN_HERE = [p for p in NOTEBOOKS if p.name != "serving_with_vllm.ipynb"]

pytestmark = [pytest.mark.torch, pytest.mark.notebook]


def test_the_notebooks_exist():
    assert {p.name for p in NOTEBOOKS} >= {"speedup_tables.ipynb", "demo.ipynb", "serving_with_vllm.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: outputs committed"


@pytest.mark.parametrize("path", RUN_HERE, ids=lambda p: p.name)
def test_runs_clean(path, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("PLD_NB_LIMIT", "2")  # (two prompts a task: a mean of ratios is not a ratio of means)
    monkeypatch.setenv("PLD_NB_MAX_NEW_TOKENS", "8")
    monkeypatch.setenv("PLD_NB_PROMPT_CHARS", "600")
    monkeypatch.setenv("PLD_NB_OUT", str(tmp_path / "out"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    nb = nbformat.read(path, as_version=4)
    # raises CellExecutionError on the first cell that fails
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if path.name == "demo.ipynb":
        assert "identical tokens: True" in text
        assert "x plain greedy's tokens/s (median of 3 alternating pairs" in text
    else:
        shown = "\n".join(o.get("data", {}).get("text/markdown", "") for c in nb.cells if c.cell_type == "code"
                          for o in c.outputs)
        published = re.search(r"\| summarization \| (\d+\.\d\d)x \| 2\.38x \|", shown)
        assert published, shown[-2000:]
        rate = {s["method"]: s["tokens_per_second"] for s in
                json.loads((tmp_path / "out" / "summary.json").read_text())["by_task"] if s["group"] == "summarization"}
        assert published.group(1) == f"{rate['pld'] / rate['greedy']:.2f}"  # a ratio of mean rates, as the method's
        assert (tmp_path / "out" / "table.md").is_file()
        assert (tmp_path / "out" / "speedup_by_task.png").is_file()
        images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
                  if "image/png" in o.get("data", {})]
        assert len(images) == 3
