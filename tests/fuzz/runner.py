"""Run a target under libFuzzer in a child process and read what it did.

Shared by ``python -m tests.fuzz`` (``scripts/fuzz``) and the bounded runs of the test
suite (``test_fuzz_bounded.py``). The child is ``python -m tests.fuzz._run TARGET``; its
corpus directories are, in order, a working one (where libFuzzer adds the inputs that
reach new code; not committed), the committed seeds and the committed crashes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import CORPUS, CRASHES, HERE

ROOT = HERE.parent.parent
MAX_LEN = 4096  # bytes of one input: the parsers' interesting states are all reachable well below
# one input taking longer is a failure (a hang): far above the slowest inputs of a loaded machine
# (14 s seen for one input of `commands` on 2 cores at a load of 9, where most take milliseconds);
# libFuzzer's report of slow inputs (from 10 s by default) is no failure, so it waits as long
TIMEOUT_S = 60
RSS_LIMIT_MB = 2048

_EXECS = re.compile(r"stat::number_of_executed_units:\s*(\d+)")
_RATE = re.compile(r"stat::average_exec_per_sec:\s*(\d+)")
_PULSE = re.compile(r"^#(\d+)\s+\S+\s+cov: (\d+) ft: (\d+) corp: (\d+)/\S+.*?exec/s: (\d+)")
_ARTIFACT = re.compile(r"Test unit written to (\S+)")


def atheris_missing() -> str | None:
    """Why atheris cannot run here, or None when it can."""
    try:
        import atheris  # noqa: F401
    except Exception as exc:  # not installed, or a platform without a wheel
        return f"atheris is not importable ({type(exc).__name__}: {exc}); pip install atheris"
    return None


@dataclass
class Result:
    target: str
    returncode: int
    seconds: float
    execs: int = 0
    exec_per_sec: int = 0
    artifacts: list[Path] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)  # the child's last lines (the failure, if any)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.artifacts


def run_target(
    target: str,
    *,
    seconds: float | None = None,
    runs: int | None = None,
    artifact_dir: Path,
    work_dir: Path | None = None,
    seed: int | None = None,
    progress: Callable[[str], None] | None = None,
    progress_every: float = 10.0,
) -> Result:
    """Fuzz ``target`` for ``seconds`` (or ``runs`` inputs); failing inputs go to ``artifact_dir``."""
    artifact_dir.mkdir(parents=True, exist_ok=True)
    dirs: list[Path] = []
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        dirs.append(work_dir)
    for d in (CORPUS / target, CRASHES / target):
        if d.is_dir() and any(d.iterdir()):
            dirs.append(d)
    if work_dir is None:
        # libFuzzer writes new inputs into its first directory: never the committed ones
        raise ValueError("work_dir is needed (libFuzzer adds to its first corpus directory)")
    flags = [
        f"-max_len={MAX_LEN}",
        f"-timeout={TIMEOUT_S}",
        f"-report_slow_units={TIMEOUT_S}",
        f"-rss_limit_mb={RSS_LIMIT_MB}",
        f"-artifact_prefix={artifact_dir}{os.sep}",
        "-print_final_stats=1",
        "-print_pcs=0",
    ]
    if seconds is not None:
        flags.append(f"-max_total_time={max(1, int(seconds))}")
    if runs is not None:
        flags.append(f"-runs={runs}")
    if seed is not None:
        flags.append(f"-seed={seed}")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "tests.fuzz._run", target, *flags, *map(str, dirs)]
    start = last = time.monotonic()
    execs = rate = 0
    tail: list[str] = []
    artifacts: list[Path] = []
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        del tail[:-60]
        if m := _PULSE.match(line):
            execs, rate = int(m.group(1)), int(m.group(5))
            now = time.monotonic()
            if progress is not None and now - last >= progress_every:
                last = now
                progress(f"{target}: {now - start:5.0f} s  {execs} inputs  {rate}/s  coverage {m.group(2)}"
                         f"  corpus {m.group(4)}")  # fmt: skip
        elif m := _EXECS.search(line):
            execs = int(m.group(1))
        elif m := _RATE.search(line):
            rate = int(m.group(1))
        elif m := _ARTIFACT.search(line):
            artifacts.append(Path(m.group(1)))
    code = proc.wait()
    return Result(target, code, time.monotonic() - start, execs, rate, artifacts, tail)
