"""One benchmark module of scripts/benchmarks run as its own process with a small load, as the
bench tests do: its raw results (the file it writes) and what it printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bench(tmp_path: Path, module: str, *options: str, timeout: float) -> tuple[dict, str]:
    """``python -m benchmarks.<module> OPTIONS --write FILE``: a failed run fails the test with its
    output; else the ``results`` of the file and the standard output."""
    out = tmp_path / ("%s.json" % module)
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.%s" % module, *options, "--write", str(out)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH="%s/scripts:%s" % (ROOT, ROOT)), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text())["results"], run.stdout
