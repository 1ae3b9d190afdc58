"""disque_py.cli.shell's pieces that need no node: how a string is quoted on a terminal (the
whole output is compared with redis-cli's against real nodes in tests/integration/test_cli_process.py)."""

from __future__ import annotations

from disque_py.cli.shell import quote


def test_quote_uses_redis_clis_escapes():
    assert quote(b'a\\b"c\nd\re\tf\x07g\x08h') == b'"a\\\\b\\"c\\nd\\re\\tf\\ag\\bh"'
    assert quote(b"\x00\x1f\x7f\xff ok~") == b'"\\x00\\x1f\\x7f\\xff ok~"'
    assert quote(b"") == b'""'
