"""The one RSS reader (disque_py/util/rss.py), on real processes."""

from __future__ import annotations

import subprocess
import sys

from disque_py.util.rss import rss_bytes


def test_this_process_has_a_resident_set_and_it_grows_with_what_it_touches():
    before = rss_bytes()
    assert before > 1 << 20  # an interpreter with pytest loaded is megabytes
    block = bytearray(64 << 20)  # zero-filled: every page written
    try:
        assert rss_bytes() >= before + (32 << 20)
    finally:
        del block


def test_another_process_is_read_by_its_pid_and_a_gone_one_reads_zero():
    child = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert child.stdout.readline() == b"up\n"  # its interpreter is loaded, not still being exec'd
        assert rss_bytes(child.pid) > 1 << 20
    finally:
        child.stdin.close()
        child.wait(timeout=10)
        child.stdout.close()
    assert rss_bytes(child.pid) == 0  # reaped: no /proc entry, and not this process
