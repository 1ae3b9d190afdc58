"""The benchmarks' progress bar: drawn on a terminal only, and lines printed around it stay whole."""

from __future__ import annotations

import os
import pty
import select
import sys
import time
from pathlib import Path

from benchmarks import progress

ROOT = Path(__file__).resolve().parents[1]


def test_off_a_terminal_nothing_is_drawn_and_lines_come_out_as_they_are(capsys):
    with progress.bar(3, "run") as bar:
        for i in range(3):
            bar.doing("cell %d" % i)
            progress.echo(">> cell %d" % i)
            bar.done()
    assert bar.count == 3
    err = capsys.readouterr().err
    assert err == ">> cell 0\n>> cell 1\n>> cell 2\n"


def _on_terminal(argv: list[str], env: dict[str, str] | None = None, timeout: float = 120.0) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as its stdout and stderr: (exit code, what it wrote)."""
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.chdir(ROOT)
            os.execve(argv[0], argv, dict(os.environ, PYTHONPATH="%s:%s" % (ROOT / "scripts", ROOT), **(env or {})))
        finally:
            os._exit(127)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the child is gone
                    break
                if not chunk:
                    break
                out += chunk
        else:
            raise AssertionError("still running:\n%s" % out.decode(errors="replace")[-2000:])
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status), out.decode("utf-8", "replace")
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


SCRIPT = """
from benchmarks import progress
with progress.bar(3, "demo") as bar:
    for i in range(3):
        bar.doing("cell %d" % i)
        progress.echo(">> cell %d" % i)
        bar.done()
"""


def test_on_a_terminal_a_bar_counts_the_cells_and_lines_clear_it_first():
    code, out = _on_terminal([sys.executable, "-c", SCRIPT])
    assert code == 0, out
    assert "demo: cell 2" in out and "3/3" in out
    for i in range(3):
        assert "\r\x1b[K>> cell %d" % i in out  # the bar's line is cleared before each line
    code, out = _on_terminal([sys.executable, "-c", SCRIPT], env={"DISQUE_BENCH_PROGRESS": "0"})
    assert code == 0 and "3/3" not in out and ">> cell 2" in out


def test_a_benchmark_run_draws_its_bar_over_its_cells():
    code, out = _on_terminal([sys.executable, "-m", "benchmarks.bench", "client-lib", "--jobs", "200", "--batch", "50",
                              "--repeat", "1", "--only", "add"])  # fmt: skip
    assert code == 0, out
    assert "scripts/bench client-lib" in out and "2/2" in out
    assert "add (trio Client.add_jobs)" in out
