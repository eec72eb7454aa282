"""pld.bench.vllm_replay without vLLM: a replay feeds a drafter as vLLM's
runner does, accepts what equals the output, and counts forwards and step
cost; pld's drafter and the bound replay a copy; the summary and the
bench's --curves check."""
from __future__ import annotations

import math
import random
import types

import numpy as np
import pytest

from pld.bench import vllm_replay as vr
from pld.bench import vllm_serving as vb


def _pair(seed=0, vocab=40, prompt_len=300, copied=(60, 160), tail=20):
    rng = random.Random(seed)
    prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
    output = prompt[copied[0]:copied[1]] + [rng.randrange(vocab) for _ in range(tail)]
    return prompt, output


def _replay(propose, prompt, output, curve="cpu", whole=False):
    token_ids = np.zeros((1, len(prompt) + len(output) + 16), dtype=np.int32)
    clock = [0.0]
    return vr.replay(propose, prompt, output, vr.CURVES[curve], token_ids, clock, whole), clock


def test_a_step_gets_the_tokens_of_the_last_step_and_the_rows_length_as_vllms_runner_gives_them():
    prompt, output = _pair()
    seen = []

    def propose(sampled, lengths, tokens):
        n = int(lengths[0])
        seen.append((list(sampled[0]), n, [int(t) for t in tokens[0, :n]]))
        return [output[len(seen[-1][2]) - len(prompt):][:3]]  # the next 3 output tokens: all accepted

    counts, _ = _replay(propose, prompt, output)
    assert seen[0] == ([output[0]], len(prompt) + 1, prompt + output[:1])
    for (sampled, n, row), (_, m, _) in zip(seen[1:], seen):
        assert row == (prompt + output)[:n] and sampled == row[m:]  # the draft accepted and one more
        assert n - m == 4 or n == len(prompt) + len(output)
    assert counts["forwards"] == math.ceil((len(output) - 1) / 4) == len(seen)
    assert counts["tokens"] == len(output) - 1


@pytest.mark.parametrize("curve", sorted(vr.CURVES))
def test_no_draft_costs_one_a_token_and_a_rejected_draft_costs_its_width(curve):
    prompt, output = _pair(1)
    never, _ = _replay(lambda s, n, t: [[]], prompt, output, curve)
    assert never["forwards"] == never["cost"] == len(output) - 1 and never["drafted"] == 0
    wrong = lambda s, n, t: [[40 + j for j in range(6)]]  # (ids no output holds)
    rejected, clock = _replay(wrong, prompt, output, curve)
    assert rejected["forwards"] == len(output) - 1 and rejected["drafted"] == 6 * (len(output) - 1)
    assert rejected["cost"] == pytest.approx((len(output) - 1) * vr.CURVES[curve](7)) == clock[0]
    bounded, _ = _replay(wrong, prompt, output, curve, whole=True)  # (the bound pays for what is accepted)
    assert bounded["cost"] == pytest.approx(len(output) - 1)


def test_the_curves_start_at_one_and_never_fall():
    for name, c in vr.CURVES.items():
        costs = [c(w) for w in range(1, 40)]
        assert costs[0] == 1.0 and all(b >= a for a, b in zip(costs, costs[1:])), name
    cpu = vr.CURVES["cpu"]
    assert (cpu(5), cpu(8), cpu(11)) == pytest.approx((1.0, 1.23, 1.32))


def test_pld_newest_is_pld_with_one_voter():
    from pld.vllm import VOTERS

    clock = [0.0]
    assert vr.drafter("pld", 10, 4096, clock).__self__.options.voters == VOTERS > 1
    assert vr.drafter("pld-newest", 10, 4096, clock).__self__.options.voters == 1


@pytest.mark.parametrize("name", ["pld", "pld-newest", "bound"])
def test_pld_and_the_bound_replay_a_copy_in_few_forwards(name):
    prompt, output = _pair(2, tail=0)
    clock = [0.0]
    token_ids = np.zeros((1, 4096), dtype=np.int32)
    counts = vr.replay(vr.drafter(name, 10, 4096, clock), prompt, output, vr.CURVES["linear"], token_ids, clock,
                       whole=name == "bound")
    assert counts["tokens"] / counts["forwards"] > 4.0
    assert counts["cost"] < len(output) - 1


def test_the_bound_drafts_pld_s_chains_cut_to_what_is_accepted():
    """Step for step, the bound's accepted tokens are the longest prefix of
    pld's whole chain (adaptive off) that equals the output."""
    prompt, output = _pair(3, vocab=12, tail=40)
    clock = [0.0]
    whole = vr.drafter("bound", 10, 4096, clock)
    drafts = []
    counts, _ = _replay(lambda s, n, t: drafts.append(whole(s, n, t)[0]) or [drafts[-1]], prompt, output,
                        "cpu", whole=True)
    assert any(len(d) == 10 for d in drafts)
    at, cost = 1, 0.0
    for d in drafts:
        a = 0
        while a < len(d) and at + a < len(output) and d[a] == output[at + a]:
            a += 1
        cost += vr.CURVES["cpu"](1 + a)
        at += a + 1
    assert cost == pytest.approx(counts["cost"])


def test_pld_s_budget_reads_the_replay_s_clock():
    clock = [0.0]
    propose = vr.drafter("pld", 10, 1024, clock)
    budget = propose.__self__.budget
    clock[0] = 12.5
    assert budget.clock() == 12.5
    with pytest.raises(ValueError, match="drafter"):
        vr.drafter("eagle", 10, 1024, clock)


def test_summary_rates_against_ngram_matched_and_the_table():
    rows = [{"task": "rag", "curve": "cpu", "item": i, "drafter": d, "forwards": f, "tokens": 100.0, "drafted": 0.0,
             "cost": c} for i in range(2) for d, f, c in (("pld", 40.0, 45.0), ("ngram-matched", 50.0, 60.0),
                                                          ("bound", 40.0, 40.0))]
    got = {s["drafter"]: s for s in vr.summarize(rows)}
    assert got["pld"]["tokens_per_forward"] == pytest.approx(2.5) and got["pld"]["prompts"] == 2
    assert got["pld"]["vs_ngram_matched"] == pytest.approx(60 / 45)
    assert got["bound"]["tokens_per_cost"] == pytest.approx(2.5)
    text = vr.table(vr.summarize(rows))
    assert "| rag | cpu | pld | 2 | 2.50 | 2.222 | 1.333x |" in text
    alone = vr.summarize([r for r in rows if r["drafter"] == "pld"])
    assert "n/a" in vr.table(alone)


@pytest.mark.parametrize("curves", ["", "cpu,tpu", "knee"])
def test_unknown_curves_are_refused_before_any_engine_starts(monkeypatch, curves):
    import argparse

    parser = argparse.ArgumentParser()
    vb.add_arguments(parser)
    args = parser.parse_args(["--parts", "replay", "--curves", curves])
    monkeypatch.setattr(vb, "start", lambda *a: pytest.fail("an engine started"))
    with pytest.raises(ValueError, match="--curves"):
        vb.run(args)


def test_the_replay_part_replays_plain_s_outputs(monkeypatch):
    import transformers

    prompt, output = _pair(4)
    tokenizer = types.SimpleNamespace(apply_chat_template=lambda messages, **kw: prompt)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    started = []
    monkeypatch.setattr(vb, "start", lambda m, *a: started.append(m) or m)
    monkeypatch.setattr(vb, "timed_generate", lambda llm, batch, n: {"outputs": [output] * len(batch)})
    monkeypatch.setattr(vr, "DRAFTERS", ("pld", "bound"))
    monkeypatch.setattr(vb, "prompts_by_task", lambda args, model: {"rag": [prompt, prompt], "summarization": [prompt]})
    args = types.SimpleNamespace(model="folder", k=10, kv_cache_bytes=1, max_new_tokens=8, curves="cpu,gpu")
    rows = vb.replay_rows(args)
    assert started == ["plain"]
    assert len(rows) == 3 * 2 * 2 and {r["curve"] for r in rows} == {"cpu", "gpu"}
    assert all(r["tokens"] == len(output) - 1 for r in rows)
