"""Shared pytest configuration for the pld test suite.

* Marker ``torch``: every test that imports torch carries it, so a sanitizer
  run (where torch's own allocator and threads only add noise) can select
  ``-m "not torch"``. Tests mark themselves with ``pytestmark`` or
  ``@pytest.mark.torch``.
* PLD_DEBUG_CACHE=1 (unless set otherwise): pld.loop checks the KV cache
  after every step.
* Under pytest-xdist, OMP_NUM_THREADS=1 (unless set otherwise): one torch
  thread a worker.
* Hypothesis profiles: ``ci`` (default, 200 examples) and ``thorough``
  (2000 examples), chosen by the environment variable HYPOTHESIS_PROFILE.
"""

from __future__ import annotations

import glob
import importlib.machinery
import os
import sys

# The loop checks after every step that the KV cache holds exactly the tokens
# it counts as cached (pld.loop.DEBUG_CHECKS, read when pld.loop is imported;
# child processes inherit it). PLD_DEBUG_CACHE=0 in the environment keeps it off.
os.environ.setdefault("PLD_DEBUG_CACHE", "1")

# Under pytest-xdist (`-n auto`: a worker a core) each worker, and the
# benchmarks and notebooks it starts, runs torch on one thread: the workers
# already fill the cores, and more threads would only hand work back and forth.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# A clone tested after a plain (not editable) `pip install .`: its pld/ has
# no built extension, yet `python -m pytest` -- and the `python -m ...`
# children some tests start -- would import it ahead of the installed
# package. Then the installed package is the one under test: the clone
# leaves sys.path, here and (PYTHONSAFEPATH) in child processes.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if "pld" not in sys.modules and not any(
        glob.glob(os.path.join(_ROOT, "pld", "_core*" + suffix))
        for suffix in importlib.machinery.EXTENSION_SUFFIXES):
    os.environ["PYTHONSAFEPATH"] = "1"
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT]

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# tests/ is not a package; make `import reference` work from any rootdir.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_COMMON = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("ci", max_examples=200, **_COMMON)
settings.register_profile("thorough", max_examples=2000, **_COMMON)
settings.register_profile("quick", max_examples=25, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "torch: the test imports torch (deselect with -m 'not torch', e.g. under sanitizers)",
    )
    config.addinivalue_line(
        "markers",
        "notebook: executes a notebook in a Jupyter kernel (nbclient, ipykernel)",
    )
    config.addinivalue_line(
        "markers",
        "vllm: runs vLLM engines (tests/vllm_engine; CI's vLLM stage, its own venv)",
    )
