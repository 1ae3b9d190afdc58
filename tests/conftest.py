"""Makes the benchmarks (``scripts/benchmarks``, outside the installed package) importable as
``benchmarks``, as ``scripts/bench`` runs them."""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))
