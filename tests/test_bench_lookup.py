"""The lookup micro-benchmark: its timing protocol, and a small run end to
end (random ids only, so no tokenizer is needed)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import pld
from pld.bench import lookup


class _RecordingIndex:
    """Stands in for an index; records every call and the context length."""

    def __init__(self, name, log, start_len):
        self.name, self.log, self.len = name, log, start_len

    def propose(self, k):
        self.log.append((self.name, "propose", self.len, k))
        return []

    def extend(self, token):
        self.len += 1
        self.log.append((self.name, "extend", self.len, token))

    def truncate(self, n):
        self.len = min(self.len, n)
        self.log.append((self.name, "truncate", self.len))


def test_time_steps_protocol():
    log = []
    L = 100
    rounds = [(list(range(1000 + 80 * r, 1040 + 80 * r)), list(range(1040 + 80 * r, 1080 + 80 * r)))
              for r in range(3)]
    indexes = {n: _RecordingIndex(n, log, L) for n in ("a", "b", "c")}
    stats = lookup.time_steps(indexes, L, rounds, batch=10)
    for name in indexes:
        s = stats[name]
        assert s["steps"] == 3 * 40 and s["batches"] == 3 * 4
        assert s["us_cold"] is not None and s["us_min_batch"] <= s["us"] <= s["us_max_batch"]
        mine = [e for e in log if e[0] == name]
        # per round: truncate to L, warm-up steps, truncate to L, timed steps
        assert sum(1 for e in mine if e[1] == "extend") == 3 * (40 + 40)
        assert max(e[2] for e in mine) == L + 40  # the context never outgrows the segment
        truncs = [i for i, e in enumerate(mine) if e[1] == "truncate"]
        assert len(truncs) == 6 and all(mine[i][2] == L for i in truncs)
        # every propose/extend pair starts after a truncate back to L
        assert mine[truncs[1] + 1][1] == "propose" and mine[truncs[1] + 1][2] == L
        # each token is stepped through once: no round replays another's
        tokens = [e[3] for e in mine if e[1] == "extend"]
        assert sorted(tokens) == list(range(1000, 1240))
    # the indexes take turns: each round's first index rotates
    starts = [log[i][0] for i in range(len(log))
              if log[i][1] == "truncate" and (i == 0 or log[i - 1][0] != log[i][0])]
    assert starts[:3] == ["a", "b", "c"] and starts[3] == "b" and starts[6] == "c"


def test_lookup_bench_small_run(tmp_path):
    # In a child process, as a user runs it: the run sets torch's thread
    # count and leaves tqdm's monitor thread and imports behind, which later
    # tests that count references (test_leaks) must not see.
    out = tmp_path / "lookup"
    argv = ["lookup", "--sizes", "512,2048", "--stream", "random", "--steps", "1000",
            "--segment", "500", "--batch", "100", "--repeats", "3", "--budget", "0.2",
            "--out", str(out)]
    done = subprocess.run([sys.executable, "-m", "pld.bench"] + argv, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    cells = res["results"]["random"]["time"]
    first = cells[lookup.IDX_FIRST]
    for L in ("512", "2048"):
        assert first[L]["steps"] == 1000 and first[L]["us"] > 0
        assert first[L]["us_cold"] > 0
        assert cells[lookup.M_DICT][L]["us"] > 0
    table = (out / "table.md").read_text()
    assert f"| {lookup.IDX_FIRST} |" in table and "out=buffer" not in table
    assert "| random | NgramIndex[first] step <= 0.5 us at every L <= 1M |" in table
    assert "first batch after another index ran (cold)" in table
    assert "| random | NgramIndex >= 5x faster than dict index (every L) |" in table
    mem = res["results"]["random"]["memory"][lookup.IDX_FIRST + " after steps"]
    assert set(mem) == {"512", "2048"}


@pytest.mark.parametrize("bad, message", [
    (["--segment", "0"], "--segment: expected an integer >= 1"),
    (["--steps", "0"], "--steps: expected an integer >= 1"),
    (["--batch", "0"], "--batch: expected an integer >= 1"),
    (["--sizes", "8"], "--sizes: expected an integer >= 16"),
    (["--sizes", "abc"], "--sizes: expected an integer, got 'abc'"),
    (["--sizes", ","], "--sizes: expected a comma-separated list"),
])
def test_lookup_bench_refuses_bad_sizes(tmp_path, bad, message, capsys):
    from pld.bench.__main__ import main

    argv = ["lookup", "--sizes", "512", "--stream", "random", "--out", str(tmp_path)] + bad
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not os.listdir(tmp_path)


def test_reserve_is_what_the_bench_relies_on():
    """The bench reserves room for a segment before timing it: the index
    must then not grow while it steps through the segment."""
    ix = pld.NgramIndex(3, 1, "first")
    # (the array of unigrams by id grows with the largest id, which reserve
    # cannot know: the prefix has already seen an id above the segment's)
    ix.extend(list(range(511)) + [10_999])
    ix.reserve(500)
    ix.propose(10)
    before = ix.nbytes
    for tok in range(10_000, 10_500):
        ix.propose(10)
        ix.extend(tok)
    assert ix.nbytes == before
