"""notebooks/serving_with_vllm.ipynb runs clean, headless (nbclient), in
the vLLM stage's venv, with a tiny budget: one request by hand through
pld's drafter, then the benchmark (one summarization prompt, plain and
pld's drafter) and its table."""
from __future__ import annotations

from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "serving_with_vllm.ipynb"


def test_the_vllm_notebook_runs_clean(model_dir, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    from pld.bench.tasks import default_spec_bench

    # (the kernel runs in tmp_path: the Spec-Bench file is the one found from the clone)
    monkeypatch.setenv("PLD_SPEC_BENCH", default_spec_bench(str(NOTEBOOK.parents[1])))
    for name, value in (("PLD_NB_LIMIT", "1"), ("PLD_NB_SINGLE", "1"), ("PLD_NB_CONCURRENCY", "0"),
                        ("PLD_NB_MAX_NEW_TOKENS", "16"), ("PLD_NB_TASKS", "summarization"),
                        ("PLD_NB_VLLM_METHODS", "plain,pld"), ("PLD_NB_VLLM_PARTS", "engine"),
                        ("PLD_NB_OUT", str(tmp_path / "out")), ("PLD_VLLM_MODEL", model_dir),
                        ("HF_HUB_OFFLINE", "1")):
        monkeypatch.setenv(name, value)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # raises CellExecutionError on the first cell that fails
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    answer = next(line for line in text.splitlines() if line.startswith("answer:"))
    assert len(answer) > len("answer: ")
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| summarization | 1 | pld |" in table and "| 1/1 |" in table
    assert (tmp_path / "out" / "vllm.png").stat().st_size > 1000
    shown = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(shown) == 1
