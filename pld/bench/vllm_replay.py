"""vLLM's greedy outputs replayed through drafters, on step-cost curves.

An engine run costs minutes a method, and its times move with the
machine's load; a replay costs a fraction of a second a prompt and repeats
exactly, so it is where a drafter's choices are weighed (on a fit set of
prompts) before an engine run measures them (on others). Each (prompt,
output) pair, what vLLM plain answered, is fed to a drafter step by step as
vLLM's runner feeds it (the tokens sampled last step, the row's length, the
row's token array). The draft's tokens are accepted while they equal the
output's (greedy verification); the step adds them and one token of the
model's own, and costs c(1 + draft tokens) on a curve, in units of a step
without drafts. The output is the same whatever the drafter; the forwards
and the cost are not.

Drafters:

- ``pld``: pld.vllm.Drafter as vLLM loads it, its budget's clock reading
  the replay's cost so far (so it learns the curve as it would learn the
  engine's step times);
- ``pld-newest``: the same with ``voters: 1`` (what followed the newest
  occurrence of the match, not what the newest 16 agree on);
- ``ngram-matched``: vLLM's NgramProposer at pld's settings (n-grams 1..3,
  k tokens every step: the earliest occurrence of the longest match);
- ``bound``: pld's whole chain (no budget) cut to the tokens that will be
  accepted: what a budget that knew the future would draft from pld's
  chains, the most that a better draft length could give.

Curves (c(w), w = 1 + draft tokens):

- ``cpu``: the embedded model's step on vLLM's CPU backend, as the budget
  learned it in an engine run (fit-set summarization prompts 41-48): flat
  to 4 draft tokens, 1.23 at 7, 1.32 at 10;
- ``linear``: 5% of a step a draft token;
- ``gpu``: 1% a draft token (the weights are read once whatever w is).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from .vllm_serving import _or_na

CURVES: Dict[str, Callable[[int], float]] = {
    "cpu": lambda w: 1.0 if w <= 5 else (1.0 + 0.23 * (w - 5) / 3 if w <= 8 else 1.23 + 0.03 * (w - 8)),
    "linear": lambda w: 1.0 + 0.05 * (w - 1),
    "gpu": lambda w: 1.0 + 0.01 * (w - 1),
}
DRAFTERS = ("pld", "pld-newest", "ngram-matched", "bound")
#: The replayed engine's max_model_len (the bench's), or the pair's length if longer.
MAX_MODEL_LEN = 8192

#: propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu) -> one draft per row
Propose = Callable[[List[List[int]], np.ndarray, np.ndarray], List[Any]]


def replay(propose: Propose, prompt: Sequence[int], output: Sequence[int], curve: Callable[[int], float],
           token_ids: np.ndarray, clock: List[float], whole: bool = False) -> Dict[str, float]:
    """One request replayed (its row: row 0 of ``token_ids``, at least
    prompt + output + 1 wide). ``output[0]`` comes from the prefill; each
    step then drafts, accepts the draft's prefix that equals the output,
    and adds it and the next output token. ``clock[0]`` grows by each
    step's cost. ``whole``: the step costs its accepted tokens only (the
    bound). Returns the steps after the prefill ("forwards"), the tokens
    they gave ("tokens": len(output) - 1), the draft tokens sent and the
    cost."""
    if not output:
        return {"forwards": 0.0, "tokens": 0.0, "drafted": 0.0, "cost": 0.0}
    n = len(prompt) + 1
    token_ids[0, :n] = [*prompt, output[0]]
    sampled, at, forwards, drafted, start = [int(output[0])], 1, 0, 0, clock[0]
    length = np.array([n], dtype=np.int32)
    while at < len(output):
        draft = [int(t) for t in propose([sampled], length, token_ids)[0]]
        accepted = 0
        while accepted < len(draft) and at + accepted < len(output) and draft[accepted] == output[at + accepted]:
            accepted += 1
        clock[0] += curve(1 + (accepted if whole else len(draft)))
        new = [int(t) for t in output[at:at + accepted + 1]]
        token_ids[0, n:n + len(new)] = new
        n += len(new)
        length[0] = n
        at += len(new)
        sampled = new
        forwards += 1
        drafted += len(draft)
    return {"forwards": float(forwards), "tokens": float(len(output) - 1), "drafted": float(drafted),
            "cost": clock[0] - start}


def drafter(name: str, k: int, max_len: int, clock: List[float]) -> Propose:
    """A fresh drafter of one request: ``name`` of DRAFTERS (ngram-matched
    needs vLLM)."""
    from .vllm_serving import _fake_config

    config = _fake_config(k, max_len, 1)
    if name == "ngram-matched":
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        proposer = NgramProposer(config)
        return lambda sampled, lengths, tokens: proposer.propose(k, sampled, lengths, tokens)
    from ..vllm import Drafter

    if name == "bound":
        config.additional_config = {"pld": {"adaptive": False}}
    elif name == "pld-newest":
        config.additional_config = {"pld": {"voters": 1}}
    elif name != "pld":
        raise ValueError(f"drafter: expected one of {', '.join(DRAFTERS)}, got {name!r}")
    pld_drafter = Drafter(config)
    if pld_drafter.budget is not None:
        pld_drafter.budget.clock = lambda: clock[0]
    return pld_drafter.propose


def replay_pairs(pairs: Sequence[Tuple[str, Sequence[int], Sequence[int]]], drafters: Sequence[str],
                 curves: Sequence[str], k: int) -> List[Dict[str, Any]]:
    """Every (task, prompt, output) pair through every drafter on every
    curve: one row each (task, item, drafter, curve and replay's counts)."""
    rows = []
    for item, (task, prompt, output) in enumerate(pairs):
        max_len = max(MAX_MODEL_LEN, len(prompt) + len(output) + k + 1)
        token_ids = np.zeros((1, max_len), dtype=np.int32)
        for curve in curves:
            for name in drafters:
                clock = [0.0]
                counts = replay(drafter(name, k, max_len, clock), prompt, output, CURVES[curve], token_ids, clock,
                                whole=name == "bound")
                rows.append({"task": task, "item": item, "drafter": name, "curve": curve, **counts})
    return rows


def summarize(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per (task, curve, drafter): tokens per forward, tokens per unit of
    step cost (a step without drafts gives 1), and that rate against
    ngram-matched's (where it ran)."""
    out = []
    for task, curve in sorted({(r["task"], r["curve"]) for r in rows}):
        mine = [r for r in rows if r["task"] == task and r["curve"] == curve]
        rate = {}
        for name in DRAFTERS:
            these = [r for r in mine if r["drafter"] == name]
            if these:
                tokens = sum(r["tokens"] for r in these)
                rate[name] = (tokens / max(1.0, sum(r["forwards"] for r in these)),
                              tokens / max(1e-12, sum(r["cost"] for r in these)), len(these))
        for name, (per_forward, per_cost, count) in rate.items():
            versus = per_cost / rate["ngram-matched"][1] if "ngram-matched" in rate else float("nan")
            out.append({"task": task, "curve": curve, "drafter": name, "prompts": count,
                        "tokens_per_forward": per_forward, "tokens_per_cost": per_cost, "vs_ngram_matched": versus})
    return out


def table(summary: Sequence[Dict[str, Any]]) -> str:
    lines = ["| task | step cost | drafter | prompts | tokens/forward | tokens per unit of cost | vs ngram-matched |",
             "|---|---|---|--:|--:|--:|--:|"]
    for s in summary:
        lines.append(f"| {s['task']} | {s['curve']} | {s['drafter']} | {s['prompts']} | "
                     f"{s['tokens_per_forward']:.2f} | {s['tokens_per_cost']:.3f} | "
                     f"{_or_na(s['vs_ngram_matched'], '.3f', 'x')} |")
    return "\n".join(lines)
