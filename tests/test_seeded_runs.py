"""A seeded run repeats: nothing inside pld (the model probe, the linear
kernel's measurement, the forward-cost calibration) draws from or changes
torch's global RNG. Checked in a fresh child process, where every one of
those runs for the first time: ``torch.manual_seed(s)`` then the first
sampling call equals a second one, and a greedy call leaves the RNG state
as it found it."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch]

CHILD = textwrap.dedent("""
    import random, sys
    import torch
    sys.path.insert(0, {tests!r})
    import models_fixtures as mf
    import pld

    model = mf.tiny_model("llama")
    ids = mf.as_ids(mf.repeated_prompt(random.Random("seeded")))
    torch.manual_seed(5)
    state = torch.random.get_rng_state()
    pld.generate(model, ids, max_new_tokens=20, eos_token_id=None, draft_tree={tree})  # greedy: draws nothing
    assert torch.equal(torch.random.get_rng_state(), state), "a greedy run changed torch's RNG state"
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        runs.append(pld.generate(model, ids, max_new_tokens=24, eos_token_id=None, do_sample=True,
                                 temperature=1.3, draft_tree={tree}, linear_kernel="auto").new_tokens)
    assert runs[0] == runs[1], runs
    print("repeats", runs[0])
""")


@pytest.mark.parametrize("tree", [False, True])
def test_the_first_seeded_sampling_call_in_a_process_repeats(tree):
    tests = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", CHILD.format(tests=tests, tree=tree)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "repeats" in done.stdout
