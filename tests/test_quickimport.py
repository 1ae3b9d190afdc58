"""``disque_py.util.quickimport``: ``import trio`` for a node's start without the ``ldconfig``
subprocess trio's import spawns to find libpthread."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from disque_py.util.quickimport import loaded_library

MAPS = """\
55d0c0a00000-55d0c0a2d000 r--p 00000000 fe:01 1 /usr/bin/python3.11
7f00000000-7f00001000 r--p 00000000 fe:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6
7f00001000-7f00002000 r-xp 00001000 fe:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6
7f00003000-7f00004000 rw-p 00000000 00:00 0 [heap]
7f00005000-7f00006000 r--p 00000000 fe:01 3 /lib/libpthread.so.0
7f00007000-7f00008000 rw-p 00000000 00:00 0
"""


def test_the_pthread_library_is_preferred_then_libc(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    assert loaded_library(maps=str(maps)) == "/lib/libpthread.so.0"
    maps.write_text("".join(line + "\n" for line in MAPS.splitlines() if "pthread" not in line))
    assert loaded_library(maps=str(maps)) == "/usr/lib/x86_64-linux-gnu/libc.so.6"


@pytest.mark.parametrize("text", ["", "garbage without paths\n\x00\xff\n", "1-2 r--p 0 0:0 0 [vdso]\n"])
def test_no_such_library_or_no_maps_file_is_none(tmp_path, text):
    maps = tmp_path / "maps"
    maps.write_text(text, errors="surrogateescape")
    assert loaded_library(maps=str(maps)) is None
    assert loaded_library(maps=str(tmp_path / "absent")) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the ldconfig call is Linux's find_library")
def test_importing_trio_so_runs_no_subprocess_and_trio_still_names_its_threads():
    """A fresh interpreter: no process is started while trio is imported (plain ``import trio``
    starts ``ldconfig -p``), trio found the library it names threads with, and ``find_library``
    is the standard one again after."""
    code = """
import subprocess, ctypes.util
started = []
class Watch(subprocess.Popen):
    def __init__(self, args, *a, **k):
        started.append(args)
        super().__init__(args, *a, **k)
subprocess.Popen = Watch
original = ctypes.util.find_library
from disque_py.util.quickimport import import_trio
trio = import_trio()
assert started == [], started
assert trio._core._thread_cache.set_os_thread_name is not None
assert ctypes.util.find_library is original
started.clear()
original("pthread")  # the standard lookup, for comparison: it does start ldconfig
print(len(started))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 1  # the watch sees a subprocess when there is one


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the stand-in is for Linux's find_library")
def test_trio_imported_first_gets_a_stand_in_and_the_standard_ctypes_util_comes_back_after():
    """Nothing imported ``ctypes.util`` (a node's start): trio is given a stand-in, so that
    ``shutil``, ``bz2``, ``lzma`` and ``tempfile`` are not imported; afterwards ``import ctypes.util``
    is the standard module, and the stand-in asked anything else than ``find_library("pthread")``
    loads the standard module and answers with it."""
    code = """
import json, sys
from disque_py.util import quickimport
trio = quickimport.import_trio()
seen = {"named": trio._core._thread_cache.set_os_thread_name is not None,
        "loaded": sorted(m for m in ("ctypes.util", "shutil", "bz2", "lzma", "tempfile") if m in sys.modules)}
import ctypes, ctypes.util
seen["standard"] = ctypes.util.__file__ == ctypes.__file__.replace("__init__.py", "util.py")
seen["c"] = ctypes.util.find_library("c")
# the stand-in, asked for another name or another library: the standard module answers
del sys.modules["ctypes.util"], ctypes.util
stand_in = quickimport._StandIn("ctypes.util")
sys.modules["ctypes.util"] = ctypes.util = stand_in
seen["other"] = callable(stand_in.test)  # ctypes.util.test, its self-test
seen["replaced"] = sys.modules["ctypes.util"] is not stand_in and not isinstance(ctypes.util, quickimport._StandIn)
print(json.dumps(seen))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen == {"named": True, "loaded": [], "standard": True, "c": seen["c"], "other": True, "replaced": True}
    assert seen["c"] and seen["c"].startswith("libc.so")
