"""Aggregation of benchmark rows into the speedup tables and plots
(pld.bench.report), on rows made up here so every number is known."""
from __future__ import annotations

import csv
import json

import pytest

from pld.bench import report


def _row(pid, task, method, tps, *, turn=1, category="c", new=10, calls=5, sha="same", fwd=0.5):
    return {"id": pid, "task": task, "category": category, "turn": turn, "method": method,
            "new_tokens": new, "seconds": new / tps, "tokens_per_second": tps,
            "forward_calls": calls, "forward_seconds": fwd * new / tps, "output_sha1": sha}


ROWS = [
    _row("a", "rag", "greedy", 10.0, calls=10), _row("a", "rag", "pld", 20.0), _row("a", "rag", "transformers", 16.0),
    _row("b", "rag", "greedy", 10.0, calls=10), _row("b", "rag", "pld", 30.0, sha="other"),
    _row("b", "rag", "transformers", 15.0),
    _row("c", "chat", "greedy", 8.0, turn=1, category="writing", calls=10), _row("c", "chat", "pld", 8.0, turn=1),
    _row("c", "chat", "greedy", 8.0, turn=2, category="writing", calls=10),
    _row("c", "chat", "pld", 16.0, turn=2, category="writing"),
    _row("d", "code", "pld", 50.0),  # no greedy reference: ignored
]


def test_per_prompt_minimum_median_and_first_calls_at_a_size():
    rows = [dict(r) for r in ROWS]
    for r in rows:
        r["first_at_size"] = r["id"] == "a"
    got = {(s.group, s.method): s for s in report.summarize(rows, ["greedy", "pld"])}
    rag = got[("rag", "pld")]
    assert (rag.speedup_min, rag.speedup_median) == (pytest.approx(2.0), pytest.approx(2.5))
    assert rag.first_speedup == pytest.approx(2.0) and rag.first_prompts == 1
    chat = got[("chat (turn 1)", "pld")]
    assert chat.first_prompts == 0 and chat.first_speedup != chat.first_speedup  # none: nan
    assert "| 2.00x / 2.50x | 2.00x (1) |" in report.markdown([rag])


def test_summaries_per_task_and_turn():
    got = {(s.group, s.method): s for s in report.summarize(ROWS, ["greedy", "transformers", "pld"])}
    assert [g for g, m in got if m == "greedy"] == ["rag", "chat (turn 1)", "chat (turn 2)"]
    rag = got[("rag", "pld")]
    assert rag.prompts == 2
    assert rag.speedup == pytest.approx(2.5) and rag.speedup_std == pytest.approx(0.7071, abs=1e-4)
    assert rag.tokens_per_second == pytest.approx(25.0)
    assert rag.vs_transformers == pytest.approx((20 / 16 + 30 / 15) / 2)
    assert rag.identical == 1
    assert rag.tokens_per_forward == pytest.approx(2.0)
    assert rag.forward_share == pytest.approx(0.5)
    assert got[("rag", "greedy")].speedup == 1.0 and got[("rag", "greedy")].tokens_per_forward == 1.0
    assert got[("chat (turn 2)", "pld")].speedup == pytest.approx(2.0)
    assert got[("chat (turn 1)", "pld")].vs_transformers != got[("chat (turn 1)", "pld")].vs_transformers  # nan
    assert ("code", "pld") not in got


def test_markdown_table_has_a_line_per_summary():
    summaries = report.summarize(ROWS, ["greedy", "pld"])
    text = report.markdown(summaries)
    lines = text.splitlines()
    assert len(lines) == 2 + len(summaries)
    assert "| rag | pld | 2 | 10 | 25.00 ± 7.07 | 2.50x ± 0.71 |" in text


def test_same_kernel_column_only_when_greedy_onednn_ran():
    rows = ROWS + [_row("a", "rag", "greedy_onednn", 12.5), _row("b", "rag", "greedy_onednn", 20.0)]
    got = {(s.group, s.method): s for s in report.summarize(rows, ["greedy", "greedy_onednn", "pld"])}
    assert got[("rag", "pld")].vs_same_kernel == pytest.approx((20 / 12.5 + 30 / 20) / 2)
    assert got[("rag", "greedy_onednn")].speedup == pytest.approx((1.25 + 2.0) / 2)
    chat = got[("chat (turn 2)", "pld")].vs_same_kernel
    assert chat != chat  # nan: no greedy_onednn row for that prompt
    text = report.markdown(list(got.values()))
    header = text.splitlines()[0]
    assert "vs greedy on oneDNN" in header
    assert all(line.count("|") == header.count("|") for line in text.splitlines())
    assert "| 2.50x ± 0.71 | 2.00x / 2.50x |  | 1.62x | 1.55x | 1/2 |" in text
    assert "vs greedy on oneDNN" not in report.markdown(report.summarize(ROWS, ["greedy", "pld"]))


def test_write_outputs(tmp_path):
    text = report.write(ROWS, ["greedy", "transformers", "pld"], str(tmp_path), "caption: a test machine")
    assert text.endswith("caption: a test machine\n")
    assert (tmp_path / "table.md").read_text() == text
    with open(tmp_path / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["group"], r["method"]) for r in rows} >= {("rag", "pld"), ("chat (turn 2)", "pld")}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["caption"] == "caption: a test machine"
    assert [s["group"] for s in summary["chat_by_turn"] if s["method"] == "pld"] == ["turn 1", "turn 2"]
    # a prompt's category is greedy's (the reference row's)
    assert {s["group"] for s in summary["chat_by_category"]} == {"writing"}
    for name in ("speedup_by_task.png", "chat_categories.png", "chat_turns.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_read_rows_tolerates_a_missing_file_and_blank_lines(tmp_path):
    assert report.read_rows(str(tmp_path / "none.jsonl")) == []
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(ROWS[0]) + "\n\n")
    assert report.read_rows(str(f)) == [ROWS[0]]


def test_the_machine_line_names_the_vector_units():
    assert report.vector_units(["fpu", "avx2", "fma"]) == "AVX2"
    assert report.vector_units(["avx2", "avx512f", "avx512_bf16"]) == "AVX-512, bf16"
    assert report.vector_units(["avx512f", "amx_tile", "amx_bf16"]) == "AMX, AVX-512, bf16"
    assert report.vector_units(["fp", "asimd", "sve", "bf16"]) == "SVE, bf16"
    assert report.vector_units(["fpu"]) == ""
