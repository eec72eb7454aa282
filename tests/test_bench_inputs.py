"""Bad input to the commands (`python -m pld ...`) and the files they read:
an error naming the option or the file (and line), before a model loads;
never a traceback, a hang or an unbounded read. No torch."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from pld import export_model
from pld.bench import builtin_tasks, corpus_stream, jsonl, report, tasks
from pld.bench.options import at_least, int_list


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


GOOD = json.dumps({"question_id": 1, "category": "summarization", "turns": ["Summarize: a b c"]})


@pytest.mark.parametrize("lines, message", [
    ([GOOD, "{not json"], "line 2: not JSON"),
    ([GOOD, "[1, 2]"], "line 2: expected a JSON object, got list"),
    ([json.dumps({"category": "rag", "turns": ["q"]})], "line 1: question_id"),
    ([json.dumps({"question_id": 1, "category": ["rag"], "turns": ["q"]})], "line 1: category"),
    ([json.dumps({"question_id": 1, "category": "rag", "turns": "hello"})], "line 1: turns"),
    ([json.dumps({"question_id": 1, "category": "rag", "turns": []})], "line 1: turns"),
    ([json.dumps({"question_id": 1, "category": "rag", "turns": [7]})], "line 1: turns"),
    ([json.dumps({"question_id": True, "category": "rag", "turns": ["q"]})], "line 1: question_id"),
])
def test_a_malformed_question_file_is_named_with_its_line_and_field(tmp_path, lines, message):
    path = _write(tmp_path / "q.jsonl", lines)
    with pytest.raises(ValueError, match=f"data: .*q.jsonl {message}"):
        tasks.spec_bench(path, ["summarization", "rag"])


def test_a_question_file_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    with pytest.raises(ValueError, match="line 2: not UTF-8"):
        tasks.spec_bench(str(path), ["summarization"])


@pytest.mark.parametrize("kind", ["folder", "fifo", "device", "missing"])
def test_a_question_path_that_is_not_a_regular_file_is_refused_unread(tmp_path, kind):
    path = str(tmp_path / "q")
    if kind == "folder":
        os.mkdir(path)
    elif kind == "fifo":
        os.mkfifo(path)  # (a read would block for ever)
    elif kind == "device":
        path = "/dev/zero"  # (a read would never end)
    with pytest.raises(ValueError, match="data: .* is not a regular file"):
        tasks.spec_bench(path, ["summarization"])


def test_reads_are_bounded_in_lines_and_files(tmp_path, monkeypatch):
    path = _write(tmp_path / "q.jsonl", [GOOD, "x" * 200])
    monkeypatch.setattr(jsonl, "MAX_LINE", 100)
    with pytest.raises(ValueError, match="line 2: longer than 100 bytes"):
        tasks.spec_bench(path, ["summarization"])
    monkeypatch.setattr(jsonl, "MAX_FILE", 50)
    with pytest.raises(ValueError, match="more than the 50 read"):
        tasks.spec_bench(path, ["summarization"])


def test_the_long_task_leaves_out_empty_documents_and_ends(tmp_path):
    empty = json.dumps({"question_id": 1, "category": "summarization", "turns": ["Summarize:"]})
    path = _write(tmp_path / "q.jsonl", [empty] * 5)
    assert tasks.spec_bench(path, ["long"]) == []  # (it looped for ever on them)
    assert tasks.joined(["", "abc"] * 5, "x")[0].turns[0].count("abc") > 1


def test_the_long_task_measures_each_document_once():
    """Joining is linear in the documents taken, not quadratic (short articles took seconds a prompt)."""
    class Counted(str):
        lengths = 0

        def __len__(self):
            Counted.lengths += 1
            return str.__len__(self)

    prompts = tasks.joined([Counted("a" * 100)] * 10, "x")
    taken = sum(p.turns[0].count("a" * 100) for p in prompts)
    assert len(prompts) == 2 * len(tasks.LONG_SIZES) and taken >= 2 * 280
    assert Counted.lengths <= taken + 10


@pytest.mark.parametrize("task", ["summarization", "rag", "chat", "code", "translation", "long"])
def test_the_builtin_sets_of_limit_and_skip_are_apart(task):
    """`--limit S` is a set to fit on, `--skip S --limit L` one to report:
    no prompt in both (they shared one once)."""
    fit = {p.id for p in tasks.load("builtin", [task], 2)}
    report_set = {p.id for p in tasks.load("builtin", [task], 8, skip=2)}
    assert fit and report_set and not fit & report_set
    assert [p.id for p in tasks.load("builtin", [task], 3)] == \
        [p.id for p in builtin_tasks.prompts([task], 3)]  # (no skip: the set as before)


def test_a_results_file_cut_mid_line_names_it_and_fresh(tmp_path):
    path = _write(tmp_path / "results.jsonl", [json.dumps({"task": "rag"}), '{"task": "r'])
    with pytest.raises(ValueError, match="results: .*results.jsonl line 2: not JSON.*--fresh"):
        report.read_rows(path)
    assert report.read_rows(str(tmp_path / "none.jsonl")) == []


def test_corpus_stream_refuses_an_empty_stream():
    with pytest.raises(ValueError, match="limit, skip"):
        corpus_stream.stream("/nonexistent", 0)
    with pytest.raises(ValueError, match="limit, skip"):
        corpus_stream.stream("/nonexistent", 3, -1)


def test_number_options_are_usage_errors():
    assert at_least(1)("3") == 3 and int_list(1)("4, 8") == [4, 8]
    for parse, text in ((at_least(1), "0"), (at_least(0), "-1"), (at_least(1), "abc"),
                        (int_list(1), "abc"), (int_list(1), "4,0"), (int_list(1), ",")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


@pytest.mark.parametrize("kind", ["file", "full", "link", "under-a-file", "nul", "empty"])
def test_export_model_checks_the_folder_before_loading(tmp_path, monkeypatch, kind):
    monkeypatch.setattr("pld.models.load", lambda *a, **k: pytest.fail("the model was loaded"))
    folder = str(tmp_path / "out")
    if kind == "file":
        open(folder, "w").close()
    elif kind == "full":
        os.mkdir(folder)
        open(os.path.join(folder, "x"), "w").close()
    elif kind == "link":
        os.symlink(str(tmp_path / "nowhere"), folder)
    elif kind == "under-a-file":
        open(tmp_path / "file", "w").close()
        folder = str(tmp_path / "file" / "missing" / "out")
    elif kind == "nul":
        folder = "out\0"
    elif kind == "empty":
        folder = ""
    with pytest.raises(ValueError, match="export-model"):
        export_model.export(folder)


class _Saved:
    """A model or tokenizer whose save_pretrained writes one file (or is cut short)."""

    def __init__(self, name, interrupt=False, mode=None):
        self.name, self.interrupt, self.mode = name, interrupt, mode

    def save_pretrained(self, folder):
        if self.interrupt:
            raise KeyboardInterrupt
        open(os.path.join(folder, self.name), "w").close()
        if self.mode is not None:  # (transformers writes model.safetensors 0600)
            os.chmod(os.path.join(folder, self.name), self.mode)


def test_an_export_makes_the_folders_above_it(tmp_path, monkeypatch):
    """As `bench vllm`'s default cache (~/.cache/pld/smollm2-hf) needs on a fresh machine."""
    monkeypatch.setattr("pld.models.load", lambda *a, **k: (None, _Saved("tokenizer.json")))
    monkeypatch.setattr(export_model, "plain_copy", lambda loaded: _Saved("config.json"))
    folder = tmp_path / "cache" / "pld" / "model"
    assert export_model.export(str(folder)) == str(folder)
    assert sorted(os.listdir(folder)) == ["config.json", "tokenizer.json"]
    assert os.listdir(tmp_path / "cache" / "pld") == ["model"]


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="no sysfs")
def test_an_export_where_no_folder_can_be_made_fails_before_loading(monkeypatch):
    """sysfs takes no new folder, not even from root (whom os.access lets write anywhere)."""
    monkeypatch.setattr("pld.models.load", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match="export-model: cannot write '/sys/pld-export'"):
        export_model.export("/sys/pld-export")


def test_an_export_has_the_mode_of_a_plain_folder(tmp_path, monkeypatch):
    """Not mkdtemp's 0700, nor the 0600 transformers gives the weights: a
    vLLM service running as another user reads them."""
    monkeypatch.setattr("pld.models.load", lambda *a, **k: (None, _Saved("tokenizer.json")))
    monkeypatch.setattr(export_model, "plain_copy", lambda loaded: _Saved("model.safetensors", mode=0o600))
    old = os.umask(0o027)
    try:
        export_model.export(str(tmp_path / "out"))
    finally:
        os.umask(old)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o750
    assert (tmp_path / "out" / "model.safetensors").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "out" / "tokenizer.json").stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("cut_short", [False, True])
def test_an_export_cut_short_leaves_no_folder_that_looks_done(tmp_path, monkeypatch, cut_short):
    monkeypatch.setattr("pld.models.load", lambda *a, **k: (None, _Saved("tokenizer.json", cut_short)))
    monkeypatch.setattr(export_model, "plain_copy", lambda loaded: _Saved("config.json"))
    folder = tmp_path / "out"
    os.mkdir(folder)  # (an empty folder is taken)
    if cut_short:
        with pytest.raises(KeyboardInterrupt):
            export_model.export(str(folder))
        assert os.listdir(folder) == [] and os.listdir(tmp_path) == ["out"]
    else:
        assert export_model.export(str(folder)) == str(folder)
        assert sorted(os.listdir(folder)) == ["config.json", "tokenizer.json"]
        assert os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("argv, message", [
    (["bench", "--tasks", "poetry"], "tasks: unknown"),
    (["bench", "--limit", "0"], "--limit: expected an integer >= 1"),
    (["bench", "--source", "spec-bench", "--data", "/dev/zero"], "is not a regular file"),
    (["demo", "-k", "0"], "--num-pred-tokens: expected an integer >= 1"),
    (["demo", "--dtype", "foo"], "--dtype: invalid choice"),
    (["demo", "--prompt-file", "/dev/zero"], "--prompt-file: '/dev/zero' is not a regular file"),
    (["export-model", ""], "export-model: expected a folder path"),
    (["bench", "host-time", "--contexts", "1k"], "--contexts: expected an integer, got '1k'"),
    (["bench", "host-time", "--dtype", "half"], "--dtype: invalid choice"),
])
def test_commands_name_a_bad_option_without_a_traceback(tmp_path, argv, message):
    proc = subprocess.run([sys.executable, "-m", "pld", *argv, *(["--out", str(tmp_path)] if argv[0] == "bench" else [])],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert message in proc.stderr, proc.stderr[-2000:]


def test_the_hub_source_without_datasets_is_a_usage_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # (import datasets raises ImportError)
    with pytest.raises(ValueError, match="--source hub: needs `pip install datasets`"):
        tasks.load("hub", ["rag"], 1)
