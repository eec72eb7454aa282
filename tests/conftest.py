"""Shared pytest configuration for the pld test suite.

* Marker ``torch``: every test that imports torch carries it, so a sanitizer
  run (where torch's own allocator and threads only add noise) can select
  ``-m "not torch"``. Tests mark themselves with ``pytestmark`` or
  ``@pytest.mark.torch``.
* Hypothesis profiles: ``ci`` (default, 200 examples) and ``thorough``
  (2000 examples), chosen by the environment variable HYPOTHESIS_PROFILE.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

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
