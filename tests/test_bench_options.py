"""The options the bench subcommands share (pld.bench.options, checked in
pld.bench.__main__ before any subcommand runs): a bad value is a usage
error naming the option, exit status 2, before a model loads or any
long work starts; never a traceback."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import pld
from pld.__main__ import run_command

TORCH = pytest.mark.torch  # (--device asks torch which devices there are)


def _refused(argv, capsys):
    """stderr of ``python -m pld bench ARGV`` run in this process; it must exit 2."""
    try:
        code = run_command("bench", argv)
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    return capsys.readouterr().err


@pytest.fixture
def nothing_loads(monkeypatch, tmp_path):
    """In tmp_path (the default --out folders are relative); any model load fails the test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("pld.models.load", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr("pld.bench.shapes.load_model", lambda *a, **k: pytest.fail("a model was loaded"))


SUBCOMMANDS_WITH_OUT = ["generation", "lookup", "flood", "kv-forward", "versus", "siblings", "corpus-stream",
                        "forward-cost", "exactness", "host-time", "replay", "vllm"]


@pytest.mark.parametrize("command", SUBCOMMANDS_WITH_OUT)
@pytest.mark.parametrize("where", ["a file", "under a file", "empty"])
def test_a_bad_out_is_refused_before_anything_runs(nothing_loads, tmp_path, capsys, command, where):
    (tmp_path / "file").write_text("")
    out = {"a file": "file", "under a file": "file/sub/out", "empty": ""}[where]
    required = ["--baseline", str(tmp_path)] if command == "versus" else []
    err = _refused([command, *required, "--out", out], capsys)
    assert "argument --out: " in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_an_out_folder_that_is_or_can_be_made_is_taken(tmp_path):
    from pld.bench.options import out_folder_problem

    assert out_folder_problem(str(tmp_path)) is None
    assert out_folder_problem(str(tmp_path / "a" / "b")) is None
    assert not (tmp_path / "a").exists()  # (checked, not made)


@pytest.mark.parametrize("argv, message", [
    (["tree-prior", "--strength", "0"], "--strength: expected a finite number > 0, got '0'"),
    (["tree-prior", "--strength", "-1"], "--strength: expected a finite number > 0"),
    (["tree-prior", "--strength", "nan"], "--strength: expected a finite number > 0"),
    (["tree-prior", "--strength", "inf"], "--strength: expected a finite number > 0"),
    (["tree-prior", "--threads", "-1"], "--threads: expected an integer from 0 to"),
    (["generation", "--threads", "2147483648"], "--threads: expected an integer from 0 to"),
    (["kv-forward", "--threads", "1000000"], "--threads: expected an integer from 0 to"),
    (["corpus-stream", "--threads", "1000000"], "--threads: expected an integer from 0 to"),
    (["versus", "--baseline", ".", "--threads", "1000000"], "--threads: expected an integer from 0 to"),
    (["siblings", "--threads", "1000000"], "--threads: expected an integer from 0 to"),
    (["siblings", "--dtype", "bogus"], "--dtype: invalid choice"),
    (["forward-cost", "--dtype", "bogus"], "--dtype: invalid choice"),
    (["flood", "--count", "65523"], "--count: expected an integer from 1 to 65522"),
    (["lookup", "--budget", "inf"], "--budget: expected a finite number > 0"),
    (["lookup", "--budget", "nan"], "--budget: expected a finite number > 0"),
    (["siblings", "--drafts", "", "--no-sample-baseline"], "--drafts: expected linear and/or tree, got ''"),
    (["siblings", "--drafts", "linear,bush"], "--drafts: expected linear and/or tree"),
    (["siblings", "--temperature", "-1"], "--temperature: expected a finite number > 0"),
    (["siblings", "--top-p", "1.5"], "--top-p: expected a number from 0 to 1"),
    (["corpus-stream", "--max-tokens", "0"], "--max-tokens: expected an integer >= 1"),
    (["generation", "--prompt-chars", "-1"], "--prompt-chars: expected an integer >= 0"),
    (["generation", "--batch-size", "0"], "--batch-size: expected an integer >= 1"),
    (["versus", "--baseline", ".", "--batch-size", "0"], "--batch-size: expected an integer >= 1"),
    pytest.param(["generation", "--device", "bogus"], "argument --device: expected auto, cpu, cuda", marks=TORCH),
    pytest.param(["siblings", "--device", "cuda:99"], "argument --device: 'cuda:99': this machine has",
                 marks=TORCH),
    pytest.param(["corpus-stream", "--device", "cuda:99"], "argument --device: 'cuda:99'", marks=TORCH),
    pytest.param(["forward-cost", "--device", "bogus"], "argument --device: expected", marks=TORCH),
])
def test_a_bad_shared_option_is_a_usage_error(nothing_loads, capsys, argv, message):
    err = _refused(argv, capsys)
    assert message in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv, message", [
    (["forward-cost", "--models", "shape:tiny@bogus"], "--models: expected MODEL[@DTYPE]"),
    (["forward-cost", "--models", ","], "--models: names no model"),
    (["replay", "--target", ""], "--target: names no model"),
    (["replay", "--source-model", "a,b"], "--source-model: expected one MODEL[@DTYPE]"),
    (["replay", "--target", "shape:7b@half"], "--target: expected MODEL[@DTYPE]"),
    pytest.param(["exactness", "--archs", "llama,typo"], "--archs: unknown model types ['typo']", marks=TORCH),
    (["generation", "--methods", ""], "methods: unknown ''"),
    (["generation", "--methods", " , "], "methods: unknown ' , '"),
    (["generation", "--batch-size", "2", "--methods", "pld"], "--methods: not with --batch-size > 1"),
    (["corpus-stream", "--data", "QUESTIONS", "--skip", "1000000"], "--skip: no prompt of the stream's"),
])
def test_selections_that_select_nothing_name_their_option(nothing_loads, tmp_path, capsys, monkeypatch,
                                                          argv, message):
    """A typo or an empty selection is an error, not an empty table or a run of greedy alone."""
    monkeypatch.setattr("pld.bench.shapes.resolve_device", lambda name: "cpu")
    (tmp_path / "q.jsonl").write_text('{"question_id": 1, "category": "rag", "turns": ["q"]}\n')
    err = _refused([str(tmp_path / "q.jsonl") if a == "QUESTIONS" else a for a in argv], capsys)
    assert message in err, err


def test_python_m_pld_bench_reports_a_bad_option_without_a_traceback(tmp_path):
    """The README's `python -m pld.bench ...` handles errors as `python -m pld bench`."""
    proc = subprocess.run([sys.executable, "-m", "pld.bench", "--tasks", "bogus", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "error: tasks: unknown ['bogus']" in proc.stderr


def test_a_missing_question_file_is_a_usage_error(nothing_loads, tmp_path, capsys, monkeypatch):
    """No --data and no Spec-Bench file where the default looks: the exit
    status and the `error:` of every other usage error (it was 1, unprefixed)."""
    from pld.bench import tasks

    monkeypatch.setattr(tasks, "default_spec_bench", lambda: (_ for _ in ()).throw(ValueError("data: none found")))
    built = os.path.dirname(os.path.dirname(os.path.abspath(pld.__file__)))  # (a built tree, as --baseline takes)
    for argv in (["generation", "--source", "spec-bench"], ["versus", "--baseline", built, "--source", "spec-bench"]):
        err = _refused(argv, capsys)
        assert "error: data: none found" in err and "Traceback" not in err, err


def test_host_time_refuses_a_question_file_without_documents(nothing_loads, tmp_path, capsys, monkeypatch):
    """Its long prompts are made of summarization and rag texts: none is an error before the model loads."""
    monkeypatch.setattr("pld.bench.shapes.resolve_device", lambda name: "cpu")
    data = tmp_path / "writing.jsonl"
    data.write_text('{"question_id": 1, "category": "writing", "turns": ["Write a poem."]}\n')
    err = _refused(["host-time", "--data", str(data)], capsys)
    assert "--data: " in err and "has no summarization or rag questions" in err, err


def test_the_notebooks_settings_name_a_bad_variable(monkeypatch):
    from pld.bench.options import env_int

    monkeypatch.delenv("PLD_NB_TEST", raising=False)
    assert env_int("PLD_NB_TEST", 7) == 7
    monkeypatch.setenv("PLD_NB_TEST", "12")
    assert env_int("PLD_NB_TEST", 7) == 12
    monkeypatch.setenv("PLD_NB_TEST", "x")
    with pytest.raises(ValueError, match="PLD_NB_TEST: expected an integer, got 'x'"):
        env_int("PLD_NB_TEST", 7)
