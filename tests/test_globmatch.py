"""The glob matcher (disque_py/util/globmatch.py): Redis's pattern syntax, as CONFIG GET and ACL
queue patterns use it."""

from __future__ import annotations

import fnmatch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque_py.util.globmatch import glob_match


@pytest.mark.parametrize("pattern,string,expected", [
    (b"*", b"port", True),
    (b"*", b"", True),
    (b"", b"", True),
    (b"", b"a", False),
    (b"port", b"port", True),
    (b"port", b"ports", False),
    (b"p?rt", b"port", True),
    (b"p?rt", b"prt", False),
    (b"max*", b"maxmemory-policy", True),
    (b"max*", b"xmax", False),
    (b"*-policy", b"maxmemory-policy", True),
    (b"*mem*", b"maxmemory", True),
    (b"a*b*c", b"aXXbYYc", True),
    (b"a*b*c", b"aXXbYY", False),
    (b"a**", b"a", True),
    (b"[abc]x", b"bx", True),
    (b"[abc]x", b"dx", False),
    (b"[^abc]x", b"dx", True),
    (b"[^abc]x", b"ax", False),
    (b"[a-c]x", b"bx", True),
    (b"[c-a]x", b"bx", True),  # reversed range
    (b"[a-c]x", b"dx", False),
    (b"[\\]]", b"]", True),
    (b"\\*", b"*", True),
    (b"\\*", b"a", False),
    (b"\\?x", b"?x", True),
    (b"a\\", b"a\\", True),
    (b"[abc", b"a", True),  # unterminated class ends with the pattern
    (b"?", b"", False),
    (b"[a]", b"", False),
])
def test_glob_match(pattern, string, expected):
    assert glob_match(pattern, string) is expected


def test_glob_nocase():
    assert glob_match(b"PORT", b"port", nocase=True)
    assert glob_match(b"[A-Z]ort", b"port", nocase=True)
    assert not glob_match(b"PORT", b"port")


@given(st.text(alphabet="ab*?[]^-c", max_size=8), st.text(alphabet="abc-", max_size=8))
@settings(max_examples=300, deadline=None)
def test_glob_agrees_with_fnmatch_on_simple_patterns(pattern, string):
    # fnmatch differs from Redis for brackets edge cases, so compare only
    # patterns made of literals, '*' and '?'.
    if any(ch in pattern for ch in "[]^"):
        return
    assert glob_match(pattern.encode(), string.encode()) == fnmatch.fnmatchcase(string, pattern)
