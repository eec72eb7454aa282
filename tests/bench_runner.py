"""Run ``python -m pld.bench ...`` in a child process for the benchmark tests."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_bench(out: Path, *argv: str, timeout: float = 600) -> Any:
    """Run the subcommand with ``--out out``; check it succeeded and return
    the results.json it wrote, with its stdout under "_stdout"."""
    proc = subprocess.run([sys.executable, "-m", "pld.bench", *argv, "--out", str(out)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    results["_stdout"] = proc.stdout
    return results
