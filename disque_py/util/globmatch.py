"""Redis-style glob patterns over bytes: one matcher for every pattern a client sends.

Used for CONFIG GET's parameter names (``config.py``, case-insensitive) and for an ACL
user's queue patterns (``server/acl.py``: ``~orders.*``). QSCAN and JSCAN take no pattern
in Disque 1.0, so the core has none. The syntax is Redis's ``stringmatch``: ``*``, ``?``,
``[abc]``, ``[^abc]``, ``[a-z]`` and ``\\x``; checked against :mod:`fnmatch` on the cases
where the two agree (tests/test_globmatch.py).

A leaf: imports nothing. The recursion is at most as deep as the pattern has ``*`` runs.
"""

from __future__ import annotations

__all__ = ["glob_match"]


def glob_match(pattern: bytes, string: bytes, nocase: bool = False) -> bool:
    """Redis-style glob: ``*``, ``?``, ``[abc]``, ``[^abc]``, ``[a-z]``
    (bounds in either order) and ``\\x`` to match ``x`` literally.  An
    unterminated ``[`` class extends to the end of the pattern."""
    if nocase:
        pattern, string = pattern.lower(), string.lower()
    return _glob(pattern, 0, string, 0)


def _glob(p: bytes, pi: int, s: bytes, si: int) -> bool:
    plen, slen = len(p), len(s)
    while pi < plen:
        c = p[pi]
        if c == 0x2A:  # *
            while pi + 1 < plen and p[pi + 1] == 0x2A:
                pi += 1
            if pi + 1 == plen:
                return True
            for k in range(si, slen + 1):
                if _glob(p, pi + 1, s, k):
                    return True
            return False
        if si >= slen:
            return False
        if c == 0x3F:  # ?
            si += 1
            pi += 1
            continue
        if c == 0x5B:  # [
            pi += 1
            negate = pi < plen and p[pi] == 0x5E
            if negate:
                pi += 1
            matched = False
            ch = s[si]
            while True:
                if pi >= plen:
                    break  # unterminated class: ends with the pattern
                pc = p[pi]
                if pc == 0x5C and pi + 1 < plen:
                    pi += 1
                    if p[pi] == ch:
                        matched = True
                elif pc == 0x5D:
                    pi += 1
                    break
                elif pi + 2 < plen and p[pi + 1] == 0x2D:
                    lo, hi = pc, p[pi + 2]
                    if lo > hi:
                        lo, hi = hi, lo
                    if lo <= ch <= hi:
                        matched = True
                    pi += 2
                elif pc == ch:
                    matched = True
                pi += 1
            if negate:
                matched = not matched
            if not matched:
                return False
            si += 1
            continue
        if c == 0x5C and pi + 1 < plen:  # backslash escape
            pi += 1
            c = p[pi]
        if c != s[si]:
            return False
        si += 1
        pi += 1
    return si == slen
