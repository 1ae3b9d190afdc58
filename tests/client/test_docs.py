"""The Python examples of docs/CLIENT.md run as they are (against the session's node)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from .conftest import ROOT, addr, free_port

pytestmark = pytest.mark.integration

DOC = ROOT / "docs" / "CLIENT.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_the_guide_has_examples():
    assert len(BLOCKS) >= 8


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index, node, tmp_path):
    code = BLOCKS[index].replace("127.0.0.1:7711", addr(node)).replace("127.0.0.1:7712", "127.0.0.1:%d" % free_port())
    script = tmp_path / ("example_%d.py" % index)
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=env, capture_output=True, timeout=30)
    assert proc.returncode == 0, "example %d failed:\n%s\n%s" % (index, code, proc.stderr.decode())
