"""Benchmark prompts (pld.bench.tasks, builtin_tasks, hub_tasks) and the
method registry (pld.bench.methods): what the harness feeds the models."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pld.bench import builtin_tasks, hub_tasks, methods, tasks
from pld.bench.tasks import Prompt

SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def _p(task, category, i):
    return Prompt(id=f"{task}/{category}/{i}", task=task, category=category, turns=("x",), source="t")


def test_parse_tasks():
    assert tasks.parse_tasks("all") == list(tasks.TASKS)
    assert tasks.parse_tasks(" rag, code ") == ["rag", "code"]
    with pytest.raises(ValueError, match="tasks: unknown"):
        tasks.parse_tasks("rag,poetry")
    with pytest.raises(ValueError, match="tasks"):
        tasks.parse_tasks(",")


def test_a_task_the_source_lacks_is_refused_not_dropped():
    assert tasks.parse_tasks("all", "spec-bench") == ["summarization", "rag", "chat", "translation", "long"]
    assert tasks.parse_tasks("all", "hub") == list(hub_tasks.DATASETS)
    for source in ("spec-bench", "hub"):
        with pytest.raises(ValueError, match=rf"tasks: the {source} source has no prompts for \['code'\]"):
            tasks.parse_tasks("rag,code", source)
        with pytest.raises(ValueError, match="tasks: .* no prompts for"):
            tasks.load(source, ["rag", "code"], 1, data="unused")
    with pytest.raises(ValueError, match="source"):
        tasks.parse_tasks("rag", "nowhere")


def test_balanced_round_robin_over_categories():
    pool = [_p("chat", "a", i) for i in range(5)] + [_p("chat", "b", i) for i in range(2)] \
        + [_p("rag", "r", i) for i in range(3)] + [_p("code", "c", 0)]
    got = tasks.balanced(pool, ["rag", "chat"], 4)
    assert [p.id for p in got] == ["rag/r/0", "rag/r/1", "rag/r/2",
                                   "chat/a/0", "chat/b/0", "chat/a/1", "chat/b/1"]
    assert [p.id for p in tasks.balanced(pool, ["chat"], 100)][-1] == "chat/a/4"
    with pytest.raises(ValueError, match="limit"):
        tasks.balanced(pool, ["chat"], 0)


def test_balanced_skip_takes_the_next_prompts_of_the_same_order():
    pool = [_p("chat", "a", i) for i in range(5)] + [_p("chat", "b", i) for i in range(2)] \
        + [_p("rag", "r", i) for i in range(3)]
    whole = [p.id for p in tasks.balanced(pool, ["chat"], 7)]
    assert [p.id for p in tasks.balanced(pool, ["chat"], 3, skip=2)] == whole[2:5]
    assert [p.id for p in tasks.balanced(pool, ["rag", "chat"], 2, skip=1)] == \
        ["rag/r/1", "rag/r/2", whole[1], whole[2]]
    assert tasks.balanced(pool, ["rag"], 5, skip=3) == []
    with pytest.raises(ValueError, match="skip"):
        tasks.balanced(pool, ["chat"], 1, skip=-1)


def test_spec_bench_maps_categories(tmp_path):
    f = tmp_path / "q.jsonl"
    rows = [{"question_id": 1, "category": "summarization", "turns": ["S"]},
            {"question_id": 2, "category": "writing", "turns": ["W1", "W2"]},
            {"question_id": 3, "category": "math_reasoning", "turns": ["M"]},
            {"question_id": 4, "category": "rag", "turns": ["R"]}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = tasks.spec_bench(str(f), ["summarization", "chat", "rag"])
    assert [(p.task, p.category, p.turns) for p in got] == [
        ("summarization", "summarization", ("S",)), ("chat", "writing", ("W1", "W2")), ("rag", "rag", ("R",))]
    with pytest.raises(ValueError, match="data"):
        tasks.load("spec-bench", ["rag"], 1, data="")
    with pytest.raises(ValueError, match="source"):
        tasks.load("nowhere", ["rag"], 1)


@pytest.mark.skipif(not SPEC_BENCH.is_file(), reason="../shared/data/spec_bench not beside the clone")
def test_spec_bench_file_covers_every_chat_category():
    got = tasks.load("spec-bench", ["summarization", "rag", "chat"], 20, data=str(SPEC_BENCH))
    chat = [p for p in got if p.task == "chat"]
    assert len(chat) == 20 and all(len(p.turns) == 2 for p in chat)
    assert len({p.category for p in chat}) == 8
    assert sum(p.task == "summarization" for p in got) == 20


@pytest.mark.parametrize("task", list(tasks.TASKS))
def test_builtin_tasks_offer_enough_distinct_prompts(task):
    got = tasks.load("builtin", [task], 10)
    assert len(got) == 10
    assert len({p.id for p in got}) == 10
    assert len({p.turns for p in got}) == 10
    assert all(p.task == task and p.source == "builtin" for p in got)
    assert all(len(p.turns) == (2 if task == "chat" else 1) for p in got)
    assert got == tasks.load("builtin", [task], 10)  # deterministic


def test_builtin_prompts_carry_their_material():
    code = builtin_tasks.prompts(["code"], 6)
    assert {p.category for p in code} == set(builtin_tasks.CODE_EDITS)
    for p in code:
        assert "```python\ndef " in p.turns[0]
        if p.category == "rename":
            old = p.turns[0].split("parameter `")[1].split("`")[0]
            assert f"`new_{old}`" in p.turns[0]
            assert p.turns[0].count(old) >= 3      # the function uses it
    for p in builtin_tasks.prompts(["rag"], 5):
        assert p.turns[0].count("Passage ") == 3
    for p in builtin_tasks.prompts(["translation"], 5):
        body = p.turns[0].split("\n\n", 1)[1]
        assert len(body) > 80 and "   " not in body
    summaries = builtin_tasks.prompts(["summarization"], 5)
    assert all(700 <= len(p.turns[0]) - len(builtin_tasks.SUMMARY) <= 2500 for p in summaries)


def test_hub_formatters_follow_the_method():
    s = hub_tasks.cnn_dailymail({"id": "abc", "article": " The article. ", "highlights": "h"}, 0)
    assert (s.id, s.task) == ("hub/cnn_dailymail/abc", "summarization")
    assert "The article." in s.turns[0]
    q = hub_tasks.hagrid({"query_id": 7, "query": "Why?", "quotes": [{"text": "one"}, {"text": "two"}]}, 0)
    assert q.task == "rag" and "one\n\ntwo" in q.turns[0] and q.turns[0].endswith("Question: Why?")
    c = hub_tasks.mt_bench({"prompt_id": 81, "category": "writing", "prompt": ["t1", "t2"]}, 0)
    assert (c.task, c.category, c.turns) == ("chat", "writing", ("t1", "t2"))


def test_registry_discovers_every_policy():
    import pld

    names = set(methods.REGISTRY)
    assert {f"pld_{p}" for p in pld.POLICIES} <= names
    assert [m.name for m in methods.select("default")] == ["greedy", "transformers", "pld"]
    assert [m.name for m in methods.select("all")] == list(methods.REGISTRY)
    assert [m.name for m in methods.select("pld_recent")] == ["greedy", "pld_recent"]
    with pytest.raises(ValueError, match="methods: unknown"):
        methods.select("pld,warp_drive")
    with pytest.raises(ValueError, match="registered twice"):
        methods.register("greedy", "again")(lambda s: None)


def test_speedup_tables_rejects_unknown_options():
    import pld.bench

    with pytest.raises(TypeError, match="unknown options \\['limt'\\]"):
        pld.bench.speedup_tables(limt=3)


@pytest.mark.parametrize("options, named", [({"max_new_tokens": 0}, "max_new_tokens"), ({"limit": "abc"}, "limit"),
                                            ({"dtype": "float8"}, "dtype"), ({"threads": -1}, "threads")])
def test_speedup_tables_checks_its_options_as_the_command_line_does(monkeypatch, options, named):
    """A notebook's values go through the command line's types and choices,
    refused with a ValueError naming the option before anything runs."""
    import pld.bench
    from pld.bench import generation

    monkeypatch.setattr(generation, "run", lambda args: pytest.fail("it ran"))
    with pytest.raises(ValueError, match=f"speedup_tables: {named}: "):
        pld.bench.speedup_tables(**options)


def test_speedup_tables_takes_values_as_the_command_line_would(monkeypatch, tmp_path):
    import json

    import pld.bench
    from pld.bench import generation

    seen = {}

    def run(args):
        seen.update(vars(args))
        (tmp_path / "summary.json").write_text(json.dumps({"by_task": []}))

    monkeypatch.setattr(generation, "run", run)
    pld.bench.speedup_tables(limit="3", max_new_tokens=16, model=None, out=str(tmp_path), no_progress=True)
    assert seen["limit"] == 3 and seen["max_new_tokens"] == 16 and seen["model"] is None and seen["no_progress"]
