"""The speedup-table harness end to end on the embedded model: every task
of the built-in set, the default methods, a tiny budget; then a second run
that resumes (and so generates nothing)."""
from __future__ import annotations

import json

import pytest

from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]


def _rows(out):
    with open(out / "results.jsonl") as fh:
        return [json.loads(line) for line in fh]


def test_builtin_run_then_resume(tmp_path, capsys):
    from pld.bench.__main__ import main
    from pld.bench.tasks import TASKS

    argv = ["--limit", "1", "--max-new-tokens", "6", "--prompt-chars", "600", "--out", str(tmp_path),
            "--no-progress"]
    assert main(argv) == 0
    rows = _rows(tmp_path)
    turns = len(TASKS) + 1  # chat has two
    assert len(rows) == 3 * turns
    assert {r["method"] for r in rows} == {"greedy", "transformers", "pld"}
    by = {(r["id"], r["turn"], r["method"]): r for r in rows}
    for r in rows:
        assert 0 < r["new_tokens"] <= 6
        assert r["forward_calls"] >= 1 and 0 < r["forward_seconds"] <= r["seconds"]
        # greedy decoding makes one forward per token; prompt lookup never more
        if r["method"] == "greedy":
            assert r["forward_calls"] == r["new_tokens"]
        else:
            assert r["forward_calls"] <= r["new_tokens"]
            assert r["output_sha1"] == by[(r["id"], r["turn"], "greedy")]["output_sha1"], r["id"]
    chat = [r for r in rows if r["task"] == "chat"]
    assert sorted({r["turn"] for r in chat}) == [1, 2]
    # turn 2's prompt holds greedy's turn-1 answer: it is longer by at least that much
    t1 = next(r for r in chat if r["turn"] == 1 and r["method"] == "greedy")
    t2 = next(r for r in chat if r["turn"] == 2 and r["method"] == "greedy")
    assert t2["prompt_tokens"] > t1["prompt_tokens"] + t1["new_tokens"]

    table = (tmp_path / "table.md").read_text()
    for label in ("summarization", "rag", "chat (turn 1)", "chat (turn 2)", "code", "translation"):
        assert f"| {label} | pld |" in table
    assert "SmolLM2-135M-Instruct" in table and "torch " in table and "transformers " in table
    assert "cut to 600 characters a turn" in table
    assert all(r["prompt_tokens"] < 400 for r in rows if r["turn"] == 1)  # (600 characters, the template)
    for png in ("speedup_by_task.png", "chat_categories.png", "chat_turns.png"):
        assert (tmp_path / png).stat().st_size > 5000
    assert table in capsys.readouterr().out

    # resume: nothing new is generated, the report is rebuilt from the file
    assert main(argv) == 0
    assert len(_rows(tmp_path)) == 3 * turns


def test_chat_input_ids_put_the_answer_between_the_turns():
    from pld import models
    from pld.bench.generation import chat_input_ids
    from transformers import AutoTokenizer

    folder, name = models.embedded_model_path()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ids = chat_input_ids(tok, ["first question", "second question"], ["the zebra answer"])
    text = tok.decode(ids[0])
    assert text.index("first question") < text.index("the zebra answer") < text.index("second question")
    assert ids.shape[0] == 1


def test_batch_run_compares_at_the_same_batch_size(tmp_path, capsys):
    """--batch-size 2: batched greedy, pld, pld_tree and pld_full on batches of the
    built-in prompts (embedded model); every row identical to greedy's."""
    from pld.bench.__main__ import main

    argv = ["--limit", "2", "--tasks", "summarization,code", "--max-new-tokens", "8", "--prompt-chars", "600",
            "--batch-size", "2", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    with open(tmp_path / "batch_results.jsonl") as fh:
        rows = [json.loads(line) for line in fh]
    methods = {r["method"] for r in rows}
    # greedy_onednn where pld's loop routes the linear layers to oneDNN here
    assert methods - {"greedy_onednn"} == {"greedy", "pld", "pld_tree", "pld_full"}
    assert len(rows) == len(methods) * 2  # two tasks, one batch of two each
    for r in rows:
        assert r["rows"] == 2 and 0 < r["new_tokens"] <= 16 and r["identical_rows"] == 2
        assert r["forward_calls"] >= 1
    greedy = {r["batch"]: r for r in rows if r["method"] == "greedy"}
    for r in rows:
        assert r["new_tokens"] == greedy[r["batch"]]["new_tokens"]
    table = (tmp_path / "batch_table.md").read_text()
    assert "| summarization | pld |" in table and "batch size 2" in table
    assert table in capsys.readouterr().out


def test_tree_prior_fits_every_row_and_measures_the_scale(capsys):
    """`python -m pld bench tree-prior` end to end on the embedded model
    (built-in prompts, a few tokens): the PRIOR literal has the successors'
    row and the three n-gram rows, each by agreement with the model's
    successors, and the scale pass prints PRIOR_SCALE."""
    import ast
    import re

    from pld.bench.__main__ import main

    argv = ["tree-prior", "--source", "builtin", "--tasks", "summarization,code", "--skip", "0",
            "--limit", "1", "--max-new-tokens", "12", "--width", "8", "--successors",
            "--scale-width", "4", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    literal = out[out.index("PRIOR = (") + len("PRIOR = "):out.index(")\n", out.index("PRIOR = (")) + 1]
    prior = ast.literal_eval(literal)
    assert len(prior) == 4 and all(len(s) == 3 and len(s[0]) == 5 and len(s[0][0]) == 4
                                   for s in prior)
    assert all(0.0 <= r <= 1.0 for n in prior for s in n for d in s for r in d)
    rows = [line.split() for line in out.splitlines()
            if re.match(r"\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+", line)]
    assert len(rows) == 4 * 3 * 5 * 4 and sum(int(r[4]) for r in rows) > 0
    # the successors were on, so some trials knew the model's successors
    assert sum(int(r[4]) for r in rows if r[3] != "4") > 0
    scale = float(re.search(r"PRIOR_SCALE = ([0-9.]+)", out).group(1))
    assert scale >= 0.0 and "predicted over" in out


def test_the_report_holds_only_this_runs_prompts(tmp_path):
    """results.jsonl may hold rows of the same configuration that this run
    did not ask for (another task, a larger --limit): resumed, not reported."""
    from pld.bench import tasks
    from pld.bench.__main__ import main

    argv = ["--tasks", "rag", "--limit", "1", "--max-new-tokens", "1", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    rows = _rows(tmp_path)
    (asked,) = tasks.load("builtin", ["rag"], 1)
    assert {r["id"] for r in rows} == {asked.id}
    with open(tmp_path / "results.jsonl", "a") as fh:
        for pid, task in (("builtin/rag/NOT-ASKED", "rag"), ("builtin/code/NOT-ASKED", "code")):
            for r in rows:
                fh.write(json.dumps(dict(r, id=pid, task=task, tokens_per_second=1000.0)) + "\n")
    assert main(argv) == 0
    assert len(_rows(tmp_path)) == 3 * len(rows)  # (nothing generated)
    by_task = json.loads((tmp_path / "summary.json").read_text())["by_task"]
    assert {(s["group"], s["method"], s["prompts"]) for s in by_task} == {
        ("rag", m, 1) for m in ("greedy", "transformers", "pld")}


def test_the_question_file_is_in_the_configuration(tmp_path):
    """Rows made from another question file (or another version of it) are not resumed."""
    import argparse

    from pld.bench import generation

    data = tmp_path / "question.jsonl"
    data.write_text(json.dumps({"question_id": 1, "category": "rag", "turns": ["q"]}) + "\n")
    p = argparse.ArgumentParser()
    generation.add_arguments(p)
    args = p.parse_args(["--source", "spec-bench", "--data", str(data)])
    before = generation._config(args, "cpu", "m")
    data.write_text(json.dumps({"question_id": 1, "category": "rag", "turns": ["another q"]}) + "\n")
    assert generation._config(args, "cpu", "m")["data"]["path"] == str(data)
    assert generation._config(args, "cpu", "m") != before
    assert "data" not in generation._config(p.parse_args([]), "cpu", "m")
