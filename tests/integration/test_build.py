"""The compiled build (setup.py, scripts/build, disque_py/_build.py, cluster_bus/_build.py):
what runs after scripts/cluster start, and that an edited source is never shadowed by its
compiled module, in disque_py or in cluster_bus (the bus codec), imported with or without
disque_py."""

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
# cluster_bus on its own: it never imports disque_py, and decides for itself
WHICH_BUS = "import cluster_bus.codec as c, sys; print(c.__file__); print('disque_py' in sys.modules)"
BOTH = WHICH + "; import cluster_bus.codec as c; print(c.__file__)"
COMPILED = "compiled (%d modules)" % len(_build.all_modules())


def _compiled_tree(tmp_path: Path) -> Path:
    """A copy of the checkout's compiled build (sources, extension files, manifest), mtimes kept."""
    if not _build.check(str(ROOT))[0]:
        pytest.skip("no up-to-date compiled build in the checkout (scripts/build; needs gcc and Python.h)")
    root = tmp_path / "tree"
    for package in ("disque_py", "cluster_bus"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
        for lib in ROOT.glob(package + "__mypyc.*"):  # a group's shared library sits beside the package
            shutil.copy2(lib, root / lib.name)
    return root


def _which(root: Path, code: str = WHICH, **env: str) -> tuple[list[str], str]:
    base = {k: v for k, v in os.environ.items() if k != _build.PURE_ENV}  # the test's own choice only
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env={**base, "PYTHONPATH": str(root), **env},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines(), out.stderr


def test_an_edited_source_runs_pure_and_says_so(tmp_path):
    root = _compiled_tree(tmp_path)
    (describe, job_file), _ = _which(root)
    assert describe == COMPILED and not job_file.endswith(".py")
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


def test_an_edited_codec_runs_pure_with_or_without_disque_py(tmp_path):
    root = _compiled_tree(tmp_path)
    codec = root / "cluster_bus" / "codec.py"
    (describe, _, codec_file), _ = _which(root, BOTH)
    assert describe == COMPILED and "cluster_bus.codec" in _build.all_modules() and not codec_file.endswith(".py")
    (codec_file, with_disque_py), err = _which(root, WHICH_BUS)
    assert not codec_file.endswith(".py") and with_disque_py == "False" and err == ""
    (codec_file, _), _ = _which(root, WHICH_BUS, DISQUE_PY_PURE="1")
    assert codec_file == str(codec)
    with open(codec, "a") as f:
        f.write("\n# edited\n")
    # cluster_bus alone: its own check runs the codec from its source, and says why
    (codec_file, with_disque_py), err = _which(root, WHICH_BUS)
    assert codec_file == str(codec) and with_disque_py == "False"
    assert "cluster_bus/codec.py changed since the build" in err and "running pure Python" in err
    # a node: the whole node runs pure Python (one build for all its modules), and INFO says why
    (describe, job_file, codec_file), err = _which(root, BOTH)
    assert describe == "pure (stale: cluster_bus/codec.py changed since the build)", describe
    assert job_file.endswith("job.py") and codec_file == str(codec)
    assert err.count("running pure Python") == 1, err


def test_an_edited_disque_py_module_runs_the_codec_pure_too(tmp_path):
    root = _compiled_tree(tmp_path)
    with open(root / "disque_py" / "core" / "job.py", "a") as f:
        f.write("\n# edited\n")
    (describe, job_file, codec_file), _ = _which(root, BOTH)
    assert describe == "pure (stale: disque_py/core/job.py changed since the build)", describe
    assert job_file.endswith("job.py") and codec_file == str(root / "cluster_bus" / "codec.py")
    # cluster_bus alone knows nothing of disque_py: its own build is current
    (codec_file, _), _ = _which(root, WHICH_BUS)
    assert not codec_file.endswith(".py")
    # imported before disque_py, the compiled codec is already there: INFO server says so
    (describe, _, codec_file), _ = _which(root, "import cluster_bus.codec; " + BOTH)
    assert describe.startswith("mixed (1 of ") and not codec_file.endswith(".py"), describe


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
    cmd = [sys.executable, "-m", "disque_py.cli.devcluster"]
    out = subprocess.run(cmd + ["start", "1", "--base-port", str(base)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    try:
        assert out.returncode == 0, out.stderr
        assert redis.Redis(port=base).info("server")["build"] == COMPILED
    finally:
        subprocess.run(cmd + ["stop"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_a_node_says_pure_when_asked(start_node, monkeypatch):
    monkeypatch.setenv("DISQUE_PY_PURE", "1")
    node = start_node()
    assert node.client().info("server")["build"] == "pure (DISQUE_PY_PURE set)"
