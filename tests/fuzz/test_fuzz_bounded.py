"""A short coverage-guided run of every target (atheris/libFuzzer, in a child process).

Each target gets ``DISQUE_FUZZ_SECONDS`` seconds (8 by default: about 45 s for all
four with the start-up), starting from the committed seeds and crashes; what the run
finds is kept in a temporary directory only. A failing input fails the test, which
prints it and says where to put it so that it becomes a regression test. Longer runs:
``scripts/fuzz --minutes N``. Skipped (with the reason) where atheris cannot be
imported. One xdist group: the runs take a core each, one at a time.
"""

from __future__ import annotations

import base64
import os

import pytest

from . import CRASHES, TARGETS
from .runner import atheris_missing, run_target

pytestmark = [pytest.mark.xdist_group("fuzz")]

SECONDS = float(os.environ.get("DISQUE_FUZZ_SECONDS", "8"))


@pytest.mark.timeout(int(SECONDS) + 120)
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_target_bounded(target, tmp_path):
    missing = atheris_missing()
    if missing:
        pytest.skip(missing)
    result = run_target(target, seconds=SECONDS, artifact_dir=tmp_path / "found", work_dir=tmp_path / "work")
    print(f"\nfuzz {target}: {result.execs} inputs in {result.seconds:.1f} s ({result.exec_per_sec}/s)")
    if not result.ok:
        saved = []
        for path in result.artifacts:
            data = path.read_bytes() if path.exists() else b""
            saved.append(f"  {path.name}: base64 {base64.b64encode(data).decode()}")
        pytest.fail(
            f"fuzz target {target!r} failed (exit {result.returncode}) after {result.execs} inputs.\n"
            + "\n".join(saved)
            + f"\nSave the input under {CRASHES / target}/ (it becomes a regression test),"
            + " fix the code, and commit both. The fuzzer's last lines:\n"
            + "\n".join(result.tail[-40:])
        )
    assert result.execs > 0, "the fuzzer ran no input:\n" + "\n".join(result.tail[-40:])
