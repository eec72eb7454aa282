"""The pure parts of the benchmarks past one row at a time: sibling drafts
(pld.bench.siblings) and one corpus across a stream of calls
(pld.bench.corpus_stream), on rows made up here so every number is known.
No model and no torch (a stand-in module where the code imports it)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import types

import pytest

from pld.bench import corpus_stream, sibling_bound, siblings


def _cells(text: str) -> dict:
    """Markdown table body -> {first two cells: the remaining cells}."""
    out = {}
    for line in text.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out[(cells[0], cells[1])] = cells[2:]
    return out


# ---------------------------------------------------------------- siblings


def _srow(task, prompt, method, new, seconds, forwards):
    return {"task": task, "prompt": prompt, "method": method, "new_tokens": new, "seconds": seconds,
            "row_forwards": forwards}


# (task, prompt) -> method -> (new tokens, seconds, row forwards)
SIB = {
    ("rag", "p1"): {"alone_linear": (40, 2.0, 20), "siblings_linear": (60, 2.0, 20), "sample": (64, 4.0, None)},
    ("rag", "p2"): {"alone_linear": (30, 1.0, 30), "siblings_linear": (30, 0.5, 15), "sample": (64, 2.0, None)},
    ("summarization", "s1"): {"alone_linear": (50, 5.0, 25), "siblings_linear": (80, 4.0, 20),
                              "sample": (32, 1.0, None)},
}
SIB_NAMES = ["alone_linear", "siblings_linear", "sample"]


def _sib_rows():
    rows = []
    for (task, prompt), methods in SIB.items():
        for m in reversed(SIB_NAMES):  # an order other than ``names``: the table must not depend on it
            rows.append(_srow(task, prompt, m, *methods[m]))
    return rows


def _expected_sibling_cells(task):
    prompts = [p for (t, p) in SIB if t == task]
    tot = {m: [sum(SIB[(task, p)][m][i] for p in prompts) for i in (0, 1)] for m in SIB_NAMES}
    fwd = {m: sum(SIB[(task, p)][m][2] for p in prompts) for m in ("alone_linear", "siblings_linear")}
    tpf = {m: tot[m][0] / fwd[m] for m in fwd}
    rate = {m: tot[m][0] / tot[m][1] for m in SIB_NAMES}
    per_tpf = [(SIB[(task, p)]["siblings_linear"][0] / SIB[(task, p)]["siblings_linear"][2])
               / (SIB[(task, p)]["alone_linear"][0] / SIB[(task, p)]["alone_linear"][2]) for p in prompts]
    per_rate = [(SIB[(task, p)]["siblings_linear"][0] / SIB[(task, p)]["siblings_linear"][1])
                / (SIB[(task, p)]["alone_linear"][0] / SIB[(task, p)]["alone_linear"][1]) for p in prompts]
    return {
        "alone_linear": [str(len(prompts)), f"{rate['alone_linear']:.2f}", f"{tpf['alone_linear']:.2f}", "", "", ""],
        "siblings_linear": [str(len(prompts)), f"{rate['siblings_linear']:.2f}", f"{tpf['siblings_linear']:.2f}",
                            f"{tpf['siblings_linear'] / tpf['alone_linear']:.2f}x; "
                            f"{statistics.median(per_tpf):.2f}x",
                            f"{rate['siblings_linear'] / rate['alone_linear']:.2f}x; "
                            f"{statistics.median(per_rate):.2f}x", ""],
        "sample": [str(len(prompts)), f"{rate['sample']:.2f}", "1.00", "", "", ""],
    }


def test_siblings_table_ratios_pooled_and_median_per_prompt():
    text = siblings.table(_sib_rows(), SIB_NAMES)
    got = _cells(text)
    assert len(text.splitlines()) == 2 + 2 * len(SIB_NAMES)
    assert list(got) == [(t, m) for t in ("rag", "summarization") for m in SIB_NAMES]
    for task in ("rag", "summarization"):
        for m, cells in _expected_sibling_cells(task).items():
            assert got[(task, m)] == cells, (task, m)
    # the same numbers written out by hand for rag: tokens/forward 70/50 alone, 90/35 siblings;
    # tokens/s 70/3 alone, 90/2.5 siblings, 128/6 sample; per prompt 1.5x and 2.0x for both measures
    assert got[("rag", "siblings_linear")][3] == "1.84x; 1.75x"
    assert got[("rag", "siblings_linear")][4] == "1.54x; 1.75x"
    assert got[("rag", "sample")][1] == "21.33" and got[("rag", "sample")][2] == "1.00"


def test_siblings_table_sample_rows_count_one_token_a_forward():
    rows = [_srow("qa", "q", "sample", 100, 4.0, None)]
    got = _cells(siblings.table(rows, ["sample"]))
    assert got == {("qa", "sample"): ["1", "25.00", "1.00", "", "", ""]}


def test_siblings_table_both_drafts_modes_pair_with_their_own_alone():
    names = ["alone_linear", "siblings_linear", "alone_tree", "siblings_tree"]
    # linear: siblings double tokens/forward; tree: siblings triple it (same seconds)
    vals = {"alone_linear": (20, 1.0, 20), "siblings_linear": (40, 1.0, 20),
            "alone_tree": (20, 1.0, 10), "siblings_tree": (60, 1.0, 10)}
    rows = [_srow("rag", "p", m, *vals[m]) for m in names]
    got = _cells(siblings.table(rows, names))
    assert got[("rag", "siblings_linear")][3:5] == ["2.00x; 2.00x", "2.00x; 2.00x"]
    assert got[("rag", "siblings_tree")][3:5] == ["3.00x; 3.00x", "3.00x; 3.00x"]


def test_siblings_tokens_per_forward_ratio_is_of_unrounded_values():
    # alone 9/8 = 1.125 tokens/forward (printed 1.12), siblings 12/4 = 3.0: exactly 2.666.. -> 2.67x,
    # from the rounded 1.12 it would be 2.68x
    rows = [_srow("rag", "p", "alone_linear", 9, 1.0, 8), _srow("rag", "p", "siblings_linear", 12, 1.0, 4)]
    got = _cells(siblings.table(rows, ["alone_linear", "siblings_linear"]))
    exact = (12 / 4) / (9 / 8)
    assert got[("rag", "siblings_linear")][3] == f"{exact:.2f}x; {exact:.2f}x"


def test_siblings_table_replay_bound_pooled_from_the_alone_runs():
    names = ["alone_tree", "siblings_tree"]
    rows = [dict(_srow("rag", "p1", "alone_tree", 40, 1.0, 20), bound=[40, 20, 10]),
            dict(_srow("rag", "p2", "alone_tree", 60, 1.0, 30), bound=[60, 40, 40]),
            _srow("rag", "p1", "siblings_tree", 40, 1.0, 20), _srow("rag", "p2", "siblings_tree", 60, 1.0, 30)]
    got = _cells(siblings.table(rows, names))
    # pooled: 100 tokens in 60 forwards alone, 50 with the siblings -> 1.20x (1.67 -> 2.00)
    assert got[("rag", "siblings_tree")][5] == "1.20x (1.67 -> 2.00)"
    assert got[("rag", "alone_tree")][5] == ""


# the replay bound (pld.bench.sibling_bound) on outputs made up so every step is known

def test_replay_without_any_match_takes_a_forward_a_token():
    assert sibling_bound.replay_steps([1, 2, 3], [4, 5, 6, 7], []) == 4


def test_replay_copies_a_repeated_span_of_the_prompt():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2]
    # suffix (1, 2) continues 3..10 in the prompt; the output is that text: one step of depth 8,
    # whose bonus token ends it -> 1 forward (8 accepted + 1 made by the model)
    assert sibling_bound.replay_steps(prompt, [3, 4, 5, 6, 7, 8, 9, 10, 1], [], depth=10) == 1
    # depth caps a step: 9 tokens at most 3 accepted + 1 a forward -> 3 forwards
    assert sibling_bound.replay_steps(prompt, [3, 4, 5, 6, 7, 8, 9, 10, 1], [], depth=3) == 3


def test_replay_with_a_sibling_that_wrote_the_same_text():
    prompt = [50, 51, 52]
    out = [60, 61, 62, 63, 64, 65, 66, 67]
    assert sibling_bound.replay_steps(prompt, out, []) == 8
    # the sibling's text after the prompt's last tokens is the row's: the first step drafts it all
    assert sibling_bound.replay_steps(prompt, out, [out]) == 1
    # a sibling whose text differs shares nothing, and no other row's text is consulted
    assert sibling_bound.replay_steps(prompt, out, [[70, 71, 72]]) == 8


def test_replay_bound_sums_rows_each_against_the_others():
    prompt = [50, 51, 52]
    a, b, c = [60, 61, 62, 63], [60, 61, 62, 63], [70, 71]
    tokens, alone, with_siblings = sibling_bound.replay_bound(prompt, [a, b, c])
    assert (tokens, alone) == (10, 10)
    # a and b each find the other's text whole (1 forward each); c finds nothing (2)
    assert with_siblings == 1 + 1 + 2


def test_siblings_arguments_defaults():
    p = argparse.ArgumentParser()
    siblings.add_arguments(p)
    a = p.parse_args([])
    assert (a.data, a.tasks, a.limit, a.skip, a.n) == ("", "summarization,rag", 8, 0, 4)
    assert (a.temperature, a.top_p, a.max_new_tokens, a.num_pred_tokens) == (0.7, 0.9, 128, 10)
    assert (a.drafts, a.no_sample_baseline, a.seed, a.model) == (["linear", "tree"], False, 0, None)
    assert (a.device, a.dtype, a.threads, a.out) == ("auto", "float32", 0, "bench-out")
    b = p.parse_args(["--n", "8", "--top-p", "0.5", "--drafts", "tree", "--no-sample-baseline"])
    assert (b.n, b.top_p, b.drafts, b.no_sample_baseline) == (8, 0.5, ["tree"], True)
    assert p.parse_args(["--drafts", " tree ,"]).drafts == ["tree"]


class _Model:
    """Only generation_config: anything else the code touched would raise."""

    def __init__(self):
        object.__setattr__(self, "generation_config", types.SimpleNamespace(eos_token_id=2))

    def __getattr__(self, name):
        raise AssertionError(f"the model was used: .{name}")

    def __call__(self, *a, **k):
        raise AssertionError("the model was called")


@pytest.fixture
def fake_torch(monkeypatch):
    """siblings._methods imports torch first; a stand-in keeps this test torch-free."""
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))


def _args(**kw):
    p = argparse.ArgumentParser()
    siblings.add_arguments(p)
    a = p.parse_args([])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def test_siblings_refuses_unknown_or_no_drafts_modes(capsys):
    p = argparse.ArgumentParser()
    siblings.add_arguments(p)
    for bad in ("bogus", "linear,bogus", "", ","):
        with pytest.raises(SystemExit):
            p.parse_args(["--drafts", bad])
        assert "--drafts" in capsys.readouterr().err


def test_siblings_methods_names(fake_torch):
    assert list(siblings._methods(_Model(), _args())) == [
        "alone_linear", "siblings_linear", "alone_tree", "siblings_tree", "sample"]
    assert list(siblings._methods(_Model(), _args(drafts=["tree"], no_sample_baseline=True))) == [
        "alone_tree", "siblings_tree"]


def test_siblings_until_eos():
    rows = [[5, 6, 2, 7], [5, 6, 7], [2, 9]]
    assert siblings._until_eos(rows, 2) == [[5, 6, 2], [5, 6, 7], [2]]
    assert siblings._until_eos([[5, 3, 2], [4, 4]], [2, 3]) == [[5, 3], [4, 4]]


# ----------------------------------------------------------- corpus stream


QUESTIONS = [
    ("rag", "r1"), ("writing", "w1"), ("translation", "t1"), ("unknown", "u1"), ("roleplay", "w2"),
    ("summarization", "s1"), ("qa", "q1"), ("math_reasoning", "m1"), ("rag", "r2"), ("writing", "w3"),
    ("translation", "t2"), ("summarization", "s2"), ("qa", "q2"), ("coding", "w4"), ("math_reasoning", "m2"),
    ("rag", "r3"), ("translation", "t3"), ("unknown", "u2"),
]


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "question.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i, (cat, qid) in enumerate(QUESTIONS):
            fh.write(json.dumps({"question_id": qid, "category": cat,
                                 "turns": [f"first {qid}", f"second {qid}"]}) + "\n")
            if i == 3:
                fh.write("\n")  # a blank line is passed over
    return str(path)


def _expected_stream(limit, skip):
    group = {"writing": "mt_bench", "roleplay": "mt_bench", "coding": "mt_bench"}
    order = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]
    per = {name: [] for name in order}
    for cat, qid in QUESTIONS:
        name = group.get(cat, cat)
        if name in per:
            per[name].append(qid)
    return [(name, qid, f"first {qid}") for name in order for qid in per[name][skip:skip + limit]]


def test_corpus_stream_categories_in_order():
    assert [name for name, _ in corpus_stream.CATEGORIES] == [
        "mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]
    assert len(corpus_stream.CATEGORIES[0][1]) == 8


def test_corpus_stream_order_limit_skip(questions):
    got = corpus_stream.stream(questions, 10)
    assert got == _expected_stream(10, 0)
    assert [qid for _, qid, _ in got] == ["w1", "w2", "w3", "w4", "t1", "t2", "t3", "s1", "s2", "q1", "q2",
                                          "m1", "m2", "r1", "r2", "r3"]
    assert all(not qid.startswith("u") for _, qid, _ in got)
    assert corpus_stream.stream(questions, 2) == _expected_stream(2, 0)
    assert [qid for _, qid, _ in corpus_stream.stream(questions, 1, skip=1)] == ["w2", "t2", "s2", "q2", "m2", "r2"]
    assert [qid for _, qid, _ in corpus_stream.stream(questions, 5, skip=2)] == ["w3", "w4", "t3", "r3"]
    assert corpus_stream.stream(questions, 3, skip=4) == []
    with pytest.raises(ValueError, match="limit"):  # (an empty run that overwrote the last one's files)
        corpus_stream.stream(questions, 0)


def _crow(place, category, method, new, forwards, seconds, identical=True):
    return {"place": place, "category": category, "id": f"q{place}", "method": method, "new_tokens": new,
            "forwards": forwards, "seconds": seconds, "corpus_tokens": 0, "identical": identical}


# place -> (category, {method: (new tokens, forwards, seconds, identical)})
CS = {
    0: ("mt_bench", {"none": (40, 20, 2.0, True), "none_again": (40, 20, 2.2, True), "corpus": (40, 10, 1.0, True)}),
    1: ("mt_bench", {"none": (60, 40, 3.0, True), "none_again": (60, 40, 2.5, True), "corpus": (60, 20, 2.0, False)}),
    2: ("rag", {"none": (100, 50, 4.0, True), "none_again": (100, 50, 4.0, False), "corpus": (100, 25, 1.0, True)}),
}


def _cs_rows():
    rows = []
    for place, (cat, methods) in CS.items():
        order = list(corpus_stream.METHODS)
        for m in order[place % 3:] + order[:place % 3]:
            rows.append(_crow(place, cat, m, *methods[m]))
    return rows


def _expected_cs_cells(places):
    def total(m, i):
        return sum(CS[p][1][m][i] for p in places)

    tpf = {m: total(m, 0) / total(m, 1) for m in corpus_stream.METHODS}
    rate = {m: total(m, 0) / total(m, 2) for m in corpus_stream.METHODS}

    def ratio(m):
        each = [(CS[p][1][m][0] / CS[p][1][m][2]) / (CS[p][1]["none"][0] / CS[p][1]["none"][2]) for p in places]
        return (f"{rate[m] / rate['none']:.2f}x ({statistics.median(each):.2f}x, "
                f"{min(each):.2f}-{max(each):.2f})")

    same = sum(CS[p][1][m][3] for p in places for m in ("none_again", "corpus"))
    return [str(len(places)), f"{tpf['none']:.2f} / {tpf['corpus']:.2f}", f"{rate['none']:.2f} / {rate['corpus']:.2f}",
            ratio("corpus"), ratio("none_again"), f"{same}/{2 * len(places)}"]


def test_corpus_stream_table_per_category_and_all():
    text = corpus_stream.table(_cs_rows())
    lines = text.splitlines()
    assert len(lines) == 2 + 3  # mt_bench, rag (empty categories left out), all
    rows = {line.strip("|").split("|")[0].strip(): [c.strip() for c in line.strip().strip("|").split("|")[1:]]
            for line in lines[2:]}
    assert list(rows) == ["mt_bench", "rag", "all"]
    assert rows["mt_bench"] == _expected_cs_cells([0, 1])
    assert rows["rag"] == _expected_cs_cells([2])
    assert rows["all"] == _expected_cs_cells([0, 1, 2])
    # by hand for mt_bench: tokens/forward 100/60 none, 100/30 corpus; tokens/s 100/5 none, 100/3 corpus;
    # per call corpus/none 2.0x and 1.5x; A/A 100/4.7 over 20 and per call 2/2.2, 3/2.5
    assert rows["mt_bench"][1] == "1.67 / 3.33"
    assert rows["mt_bench"][2] == "20.00 / 33.33"
    assert rows["mt_bench"][3] == "1.67x (1.75x, 1.50-2.00)"
    assert rows["mt_bench"][4] == f"{100 / 4.7 / 20:.2f}x ({(2 / 2.2 + 3 / 2.5) / 2:.2f}x, 0.91-1.20)"
    assert rows["mt_bench"][5] == "3/4" and rows["rag"][5] == "1/2" and rows["all"][5] == "4/6"
    assert rows["rag"][3] == "4.00x (4.00x, 4.00-4.00)"


def test_corpus_stream_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "corpus_stream.png"
    corpus_stream.plot(_cs_rows(), str(path), 2, "a caption " * 40)
    data = path.read_bytes()
    assert len(data) > 1000
    assert data[:8] == b"\x89PNG\r\n\x1a\n"


def test_corpus_stream_arguments_defaults():
    p = argparse.ArgumentParser()
    corpus_stream.add_arguments(p)
    a = p.parse_args([])
    assert (a.limit, a.skip, a.max_new_tokens, a.num_pred_tokens, a.drafts) == (8, 0, 128, 10, "linear")
    assert (a.max_tokens, a.window, a.out) == (1 << 22, 4, "bench-out")
    with pytest.raises(SystemExit):
        p.parse_args(["--drafts", "bogus"])
