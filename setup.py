"""The compiled build: mypyc compiles disque_py._build.COMPILED_MODULES and
cluster_bus._build.COMPILED_MODULES, one group per package (pyproject.toml holds everything
else).

`pip wheel .` / `pip install .` compile them when mypy (a build requirement) and a C
compiler are there; without a compiler, or with DISQUE_PY_PURE=1, the install is pure
Python and says so. In a checkout, `scripts/build` compiles them in place
(`python setup.py build_ext --inplace`). Either way the build records the sources it
compiled (disque_py/_compiled.txt, cluster_bus/_compiled.txt), so that a compiled module never runs for edited source
(disque_py/_build.py).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def _load_build():
    # disque_py/_build.py by path: importing the package would import its dependencies. It
    # imports cluster_bus (its check), which decides on the build being made: under
    # DISQUE_PY_PURE, so that it says nothing about it.
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    pure = os.environ.get("DISQUE_PY_PURE")
    os.environ["DISQUE_PY_PURE"] = "1"
    try:
        spec = importlib.util.spec_from_file_location("_disque_py_build", os.path.join(ROOT, "disque_py", "_build.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if pure is None:
            del os.environ["DISQUE_PY_PURE"]
        else:
            os.environ["DISQUE_PY_PURE"] = pure
    return module


_build = _load_build()


def _why_pure() -> str | None:
    if os.environ.get(_build.PURE_ENV, "") not in ("", "0"):
        return "%s is set" % _build.PURE_ENV
    if not any(shutil.which(cc) for cc in ((os.environ.get("CC") or "cc").split()[0], "gcc", "cc")):
        return "no C compiler (install gcc)"
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return "no Python headers in %s (install python3-dev)" % include
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypy (mypyc) is not installed"
    return None


class BuildExt(build_ext):
    """build_ext that records the compiled sources beside the extensions."""

    def run(self) -> None:
        super().run()
        target = ROOT if self.inplace else self.build_lib
        paths = [_build._bus.write_package_manifest(target, "cluster_bus", _build._bus.COMPILED_MODULES, ROOT),
                 _build.write_manifest(target, ROOT)]  # fmt: skip
        print("disque-py: compiled %d modules with mypyc (%s)" % (len(_build.all_modules()), ", ".join(paths)))


def _extensions() -> list:
    why = _why_pure()
    if why is not None:
        print("disque-py: building pure Python: %s" % why, file=sys.stderr)
        return []
    from mypyc.build import mypycify

    config = os.path.join(ROOT, "mypyc.ini")
    extensions = []
    # One group per package, compiled apart: each package's compiled modules call only each
    # other natively (the codec is a plain Python module to disque_py's), so that each
    # package may run compiled or pure on its own (cluster_bus never imports disque_py).
    for group, modules in (("cluster_bus", _build._bus.COMPILED_MODULES), ("disque_py", _build.COMPILED_MODULES)):
        paths = [os.path.relpath(_build.source_path(m, ROOT), ROOT) for m in modules]
        extensions += mypycify(
            (["--config-file", config] if os.path.exists(config) else []) + paths,
            opt_level=os.environ.get("MYPYC_OPT_LEVEL", "3"),
            group_name=group,
        )
    return extensions


_ext = _extensions()
setup(ext_modules=_ext, cmdclass={"build_ext": BuildExt} if _ext else {})
