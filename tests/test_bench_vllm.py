"""pld.bench.vllm_serving's bookkeeping without vLLM: the engine arguments
of each method, the summary of canned runs (ratios against plain per item,
tokens per forward from accepted drafts, identical outputs), the table and
the plot; and export-model's refusals."""
from __future__ import annotations

import pytest

from pld.bench import vllm_serving as vb


def _row(item, method, tokens, seconds, accepted=0.0, outputs=None, concurrency=1, task="rag"):
    return {"task": task, "concurrency": concurrency, "item": item, "method": method, "tokens": tokens,
            "seconds": seconds, "accepted": accepted, "draft_tokens": 2 * accepted,
            "outputs": outputs if outputs is not None else [[1, 2, 3]]}


def test_methods_map_to_vllm_arguments():
    assert vb.speculative_config("plain", 10) == {}
    assert vb.speculative_config("ngram", 10)["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 10}
    matched = vb.speculative_config("ngram-matched", 7)["speculative_config"]
    assert (matched["prompt_lookup_min"], matched["prompt_lookup_max"], matched["num_speculative_tokens"]) == (1, 3, 7)
    assert vb.speculative_config("pld", 10) == {
        "speculative_config": {"model": "pld.vllm.Drafter", "num_speculative_tokens": 10}}
    assert vb.speculative_config("pld-corpus", 10)["additional_config"] == {"pld": {"learn": True}}
    assert vb.speculative_config("pld-newest", 10)["additional_config"] == {"pld": {"voters": 1}}
    on_gpu = vb.speculative_config("ngram-gpu", 10)["speculative_config"]
    assert (on_gpu["method"], on_gpu["prompt_lookup_min"], on_gpu["prompt_lookup_max"]) == ("ngram_gpu", 1, 3)


def test_engines_ask_for_a_share_of_a_gpu_and_nothing_on_a_cpu(monkeypatch):
    monkeypatch.setattr(vb, "on_cuda", lambda: False)
    assert vb.memory_options() == {}
    monkeypatch.setattr(vb, "on_cuda", lambda: True)
    assert vb.memory_options() == {"gpu_memory_utilization": 0.1}


def test_summary_ratios_tokens_per_forward_and_identical_outputs():
    rows = [_row(0, "plain", 100, 10.0), _row(0, "pld", 100, 5.0, accepted=50),
            _row(1, "plain", 100, 10.0), _row(1, "pld", 100, 8.0, accepted=20, outputs=[[9]])]
    got = {s["method"]: s for s in vb.summarize(rows, ["plain", "pld"])}
    assert got["plain"]["vs_plain_median"] == pytest.approx(1.0)
    assert got["pld"]["vs_plain_median"] == pytest.approx((2.0 + 1.25) / 2)
    assert got["pld"]["vs_plain_min"] == pytest.approx(1.25)
    assert got["pld"]["tokens_per_s"] == pytest.approx(200 / 13.0)
    assert got["pld"]["tokens_per_forward"] == pytest.approx(200 / (200 - 70))
    assert got["pld"]["accepted_share"] == pytest.approx(70 / 140)
    assert got["pld"]["identical"] == "1/2"


def test_batched_and_single_runs_are_summarized_apart(tmp_path):
    rows = [_row(0, "plain", 100, 10.0), _row(0, "pld", 100, 5.0),
            _row(1, "plain", 800, 20.0, concurrency=8), _row(1, "pld", 800, 40.0, concurrency=8)]
    summary = vb.summarize(rows, ["plain", "pld"])
    assert [(s["concurrency"], s["method"]) for s in summary] == [(1, "plain"), (1, "pld"), (8, "plain"), (8, "pld")]
    assert summary[3]["vs_plain_median"] == pytest.approx(0.5)
    drafter = [{"rows": 1, "context": 1024, "pld_us": 2.0, "vllm-ngram_us": 20.0, "pld_mean_us": 4.0, "vllm-ngram_mean_us": 22.0}]
    text = vb.table(summary, drafter, "CAPTION")
    assert "| rag | 8 | pld | 20.00 | 0.50x, 0.50x |" in text
    assert "| 1 | 1024 | 2.0; 4.0 | 20.0; 22.0 | 10.0x; 5.5x |" in text and text.endswith("CAPTION")
    vb.plot(summary, str(tmp_path / "p.png"), "CAPTION")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_unknown_methods_are_refused():
    with pytest.raises(ValueError, match="--methods"):
        vb.available(["plain", "eagle"])


def test_export_model_refuses_a_folder_with_files(tmp_path):
    from pld.export_model import export

    (tmp_path / "x").write_text("keep me")
    with pytest.raises(ValueError, match="not an empty folder"):
        export(str(tmp_path))
    assert (tmp_path / "x").read_text() == "keep me"
    with pytest.raises(ValueError, match="dtype"):
        export(str(tmp_path / "new"), dtype="int8")
    assert not (tmp_path / "new").exists()


def test_acceptance_reads_vllms_per_request_metrics():
    import types

    done = types.SimpleNamespace(spec_decode_metrics=types.SimpleNamespace(histogram=[4, 2, 0, 3], num_draft_tokens=20))
    assert vb.acceptance(done) == {"accepted": 2.0 + 9.0, "draft_tokens": 20.0}
    assert vb.acceptance(types.SimpleNamespace(spec_decode_metrics=None)) == {"accepted": 0.0, "draft_tokens": 0.0}


def test_a_vllm_without_per_request_metrics_gives_n_a_not_one_token_a_forward():
    import math
    import types

    counts = vb.acceptance(types.SimpleNamespace())  # a release before per_request_spec_decode_metrics
    assert math.isnan(counts["accepted"]) and math.isnan(counts["draft_tokens"])
    rows = [_row(0, "plain", 100, 10.0, accepted=counts["accepted"]),
            _row(0, "pld", 100, 5.0, accepted=counts["accepted"])]
    summary = vb.summarize(rows, ["plain", "pld"])
    assert math.isnan(summary[1]["tokens_per_forward"])
    assert "| rag | 1 | pld | 20.00 | 2.00x, 2.00x | n/a | n/a | 1/1 |" in vb.table(summary, [], "C")


def test_the_stream_part_runs_six_categories_in_order_on_each_engine(monkeypatch, tmp_path):
    """--parts stream: the first turns of the six categories, in stream
    order, one request at a time on plain, pld and pld-corpus (the methods
    rotating per item, each engine seeing every item in order); rows of
    the whole stream again under stream:all; the summary has both."""
    import json
    import types

    import transformers

    data = tmp_path / "q.jsonl"
    cats = ["writing", "translation", "summarization", "qa", "math_reasoning", "rag", "coding"]
    with open(data, "w") as fh:
        for i in range(21):
            fh.write(json.dumps({"question_id": i, "category": cats[i % 7], "turns": [f"text {i}"]}) + "\n")
    tokenizer = types.SimpleNamespace(
        apply_chat_template=lambda messages, **kw: [int(messages[0]["content"].split()[1])])
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    seen = {}
    monkeypatch.setattr(vb, "start", lambda m, *a: m)
    monkeypatch.setattr(vb, "timed_generate", lambda llm, batch, n: (
        seen.setdefault(llm, []).append(batch[0][0]) or
        {"seconds": 1.0, "tokens": 10, "outputs": [[1]], "accepted": 5.0 if llm == "pld-corpus" else 2.0,
         "draft_tokens": 8.0}))
    args = types.SimpleNamespace(model="folder", data=str(data), stream_limit=2, skip=0, k=10, kv_cache_bytes=1,
                                 max_new_tokens=8, methods="plain,ngram,pld,pld-corpus")
    rows = vb.stream_runs(args)
    # mt_bench (writing, coding), translation, summarization, qa, math_reasoning, rag: 2 each, in that order
    order = [0, 6, 1, 8, 2, 9, 3, 10, 4, 11, 5, 12]
    assert seen == {"plain": order, "pld": order, "pld-corpus": order}
    summary = vb.summarize(rows, ["plain", "pld", "pld-corpus"])
    tasks = {s["task"] for s in summary}
    assert tasks == {f"stream:{c}" for c in ("mt_bench", "translation", "summarization", "qa", "math_reasoning",
                                             "rag", "all")}
    whole = {s["method"]: s for s in summary if s["task"] == "stream:all"}
    assert whole["pld-corpus"]["tokens_per_forward"] == pytest.approx(120 / 60)
    assert whole["pld"]["tokens_per_forward"] == pytest.approx(120 / 96)


@pytest.mark.parametrize("name, value", [("stream_limit", 0), ("stream_limit", -3), ("limit", 0), ("k", 0),
                                         ("max_new_tokens", 0), ("single", -1)])
def test_counts_out_of_range_are_refused_before_any_engine_starts(monkeypatch, name, value):
    import argparse

    parser = argparse.ArgumentParser()
    vb.add_arguments(parser)
    args = parser.parse_args(["--parts", "stream"])
    setattr(args, name, value)
    monkeypatch.setattr(vb, "start", lambda *a: pytest.fail("an engine started"))
    with pytest.raises(ValueError, match="--" + name.replace("_", "-")):
        vb.run(args)


@pytest.mark.parametrize("parts", ["engine", "stream", "drafter,engine"])
def test_the_engine_parts_refuse_methods_without_plain(monkeypatch, parts):
    """Their summary is each method against plain: without it every engine ran for a KeyError."""
    import argparse

    parser = argparse.ArgumentParser()
    vb.add_arguments(parser)
    args = parser.parse_args(["--parts", parts, "--methods", "pld,ngram"])
    monkeypatch.setattr(vb, "start", lambda *a: pytest.fail("an engine started"))
    monkeypatch.setattr(vb, "drafter_times", lambda *a: pytest.fail("the drafter was timed"))
    with pytest.raises(ValueError, match="--methods: .*include plain"):
        vb.run(args)


def test_the_caption_counts_the_single_requests_that_run(monkeypatch):
    """--single above --limit runs --limit prompts one at a time; the caption says so."""
    import argparse
    import sys
    import types

    parser = argparse.ArgumentParser()
    vb.add_arguments(parser)
    args = parser.parse_args(["--parts", "engine", "--limit", "2", "--single", "5"])
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.0"))
    monkeypatch.setattr(vb, "on_cuda", lambda: False)
    assert "2 a task after 20 (2 of them one at a time)" in vb.caption(args)
