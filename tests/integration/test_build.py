"""The compiled build (setup.py, scripts/build, disque_py/_build.py): what runs after
scripts/cluster start, and that an edited source is never shadowed by its compiled module."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from disque_py import _build

from .conftest import ROOT, consecutive_free_ports

WHICH = "import disque_py._build as b, disque_py.core.job as j; print(b.describe()); print(j.__file__)"


def _compiled_tree(tmp_path: Path) -> Path:
    """A copy of the checkout's compiled build (sources, extension files, manifest), mtimes kept."""
    if not _build.check(str(ROOT))[0]:
        pytest.skip("no up-to-date compiled build in the checkout (scripts/build; needs gcc and Python.h)")
    root = tmp_path / "tree"
    shutil.copytree(ROOT / "disque_py", root / "disque_py", ignore=shutil.ignore_patterns("__pycache__"))
    for lib in ROOT.glob("disque_py__mypyc.*"):  # the modules' shared library sits beside the package
        shutil.copy2(lib, root / lib.name)
    return root


def _which(root: Path, **env: str) -> tuple[list[str], str]:
    base = {k: v for k, v in os.environ.items() if k != _build.PURE_ENV}  # the test's own choice only
    out = subprocess.run([sys.executable, "-c", WHICH], cwd=root, env={**base, "PYTHONPATH": str(root), **env},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines(), out.stderr


def test_an_edited_source_runs_pure_and_says_so(tmp_path):
    root = _compiled_tree(tmp_path)
    (describe, job_file), _ = _which(root)
    assert describe == "compiled (%d modules)" % len(_build.COMPILED_MODULES) and not job_file.endswith(".py")
    (describe, job_file), _ = _which(root, DISQUE_PY_PURE="1")
    assert describe == "pure (DISQUE_PY_PURE set)" and job_file == str(root / "disque_py" / "core" / "job.py")
    # touched but the same text: still the compiled build
    os.utime(root / "disque_py" / "core" / "store.py")
    (describe, _), _ = _which(root)
    assert describe.startswith("compiled")
    # edited: every compiled module runs from its source, and stderr says why
    with open(root / "disque_py" / "core" / "store.py", "a") as f:
        f.write("\n# edited\n")
    (describe, job_file), err = _which(root)
    assert describe == "pure (stale: disque_py/core/store.py changed since the build)", describe
    assert job_file.endswith("job.py")
    assert "disque_py/core/store.py changed since the build" in err and "running pure Python" in err


def test_a_missing_or_half_build_runs_pure(tmp_path):
    root = _compiled_tree(tmp_path)
    ext = _build.extension_path("disque_py.core.ids", str(root))
    assert ext is not None
    os.remove(ext)
    (describe, job_file), _ = _which(root)
    assert describe == "pure (incomplete build: disque_py/core/ids.py has no compiled module)" and job_file.endswith(".py")
    os.remove(root / "disque_py" / _build.MANIFEST)
    (describe, job_file), err = _which(root)
    assert describe == "pure (not built)" and job_file.endswith(".py") and err == ""


def test_scripts_cluster_start_runs_the_compiled_build(tmp_path):
    """scripts/cluster start = scripts/build, then the dev cluster; run here from tmp_path so
    that its run/ directory is the test's own. scripts/test builds before the tests run, so
    here scripts/build has nothing to do (a test does not compile: other tests run meanwhile)."""
    ok, why = _build.check(str(ROOT))
    if not ok:
        pytest.skip("no current compiled build (%s): scripts/build, which scripts/test runs first" % why)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(_build.PURE_ENV, None)
    build = subprocess.run([str(ROOT / "scripts" / "build")], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert build.returncode == 0 and build.stderr == "", build.stderr  # current: nothing to say
    base = consecutive_free_ports(1)
    cmd = [sys.executable, "-m", "disque_py.devcluster"]
    out = subprocess.run(cmd + ["start", "1", "--base-port", str(base)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    try:
        assert out.returncode == 0, out.stderr
        assert redis.Redis(port=base).info("server")["build"] == "compiled (%d modules)" % len(_build.COMPILED_MODULES)
    finally:
        subprocess.run(cmd + ["stop"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_a_node_says_pure_when_asked(start_node, monkeypatch):
    monkeypatch.setenv("DISQUE_PY_PURE", "1")
    node = start_node()
    assert node.client().info("server")["build"] == "pure (DISQUE_PY_PURE set)"
