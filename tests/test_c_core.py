"""The C core on its own: csrc/tests/test_core.c under ASan/UBSan, and a
warning-free build of every core source.

These tests need gcc and make. They never skip: a machine without a C
compiler cannot build pld either, so a missing tool is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
EXPECTED_CORE = {"pld_lookup.c", "pld_index.c", "pld_accept.c"}


def _clean_env() -> dict[str, str]:
    # Under the sanitizer pass LD_PRELOAD carries libasan/libubsan; make and
    # gcc must not run with them preloaded.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
    env["LC_ALL"] = "C"
    return env


def _require(tool: str) -> str:
    path = shutil.which(tool)
    assert path is not None, f"{tool} not found on PATH: the C core tests need it (not skipping)"
    return path


def _core_sources() -> list[Path]:
    return sorted(p for p in CSRC.glob("pld_*.c") if p.name != "pld_module.c")


def test_core_program_passes_under_sanitizers(tmp_path):
    _require("gcc")
    make = _require("make")
    proc = subprocess.run(
        [make, "-C", str(CSRC), "test", f"BUILD={tmp_path}"],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"make test failed ({proc.returncode}):\n{out[-6000:]}"
    lines = re.findall(r"^test_core: (\d+) passed, (\d+) failed$", proc.stdout, re.M)
    assert len(lines) == 1, f"no closing line from test_core:\n{out[-6000:]}"
    passed, failed = (int(x) for x in lines[0])
    assert failed == 0
    assert passed > 1000, f"suspiciously few checks ran: {passed}"
    assert "runtime error" not in out and "AddressSanitizer" not in out, out[-6000:]


def test_core_sources_compile_without_warnings(tmp_path):
    gcc = _require("gcc")
    sources = _core_sources()
    names = {p.name for p in sources}
    assert EXPECTED_CORE <= names, f"missing core sources: {sorted(EXPECTED_CORE - names)}"
    failures = []
    for src in sources:
        # -O2 as well: some warnings (maybe-uninitialized, ...) need the optimiser.
        for opt in ("-O0", "-O2"):
            proc = subprocess.run(
                [gcc, "-Wall", "-Wextra", "-Werror", "-std=c11", opt, "-c", str(src),
                 "-I", str(CSRC), "-o", str(tmp_path / (src.stem + ".o"))],
                env=_clean_env(),
                capture_output=True,
                text=True,
                timeout=300,
            )
            if proc.returncode != 0:
                failures.append(f"{src.name} ({opt}):\n{proc.stderr}")
    assert not failures, "\n".join(failures)
