"""Makes the benchmarks (``scripts/benchmarks``, outside the installed package) importable as
``benchmarks``, as ``scripts/bench`` runs them; runs the suite's checks of itself (tests/ci.py)."""

from __future__ import annotations

import sys
from pathlib import Path

# the suite's checks of itself: the build each pass should run, and no skip in silence
from tests.ci import pytest_sessionfinish, pytest_sessionstart, pytest_terminal_summary  # noqa: F401 (hooks)

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

