"""COMMAND DOCS: the commands' declarations (``core/commandspec.py``) in Redis 7's shape.

Each declaration's ``syntax`` is a line in Redis's notation (commandspec's docstring says
it). :func:`read_syntax` reads one into a small tree (words, optional parts, alternatives,
repetitions) and fails on a line that breaks the notation, so that a test can read every
declaration; :func:`alternatives` splits a command's subcommand forms (``CONFIG GET
parameter | SET parameter value``) for ``disque-py cli``'s help; :func:`docs_reply` makes
COMMAND DOCS' reply, once, when a node is made: a map of command name to ``summary``,
``since``, ``group`` and ``arguments`` (Redis 7's argument maps: ``name``, ``type``,
``token``, ``flags``: optional, multiple, multiple_token), which redis-cli 7 turns back into
the syntax line for its ``help`` and its hints.

A leaf: it imports only the declarations' type. Nothing here runs per command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Union

from ..core.commandspec import CommandSpec
from ..core.replies import Status

__all__ = ["SyntaxProblem", "Word", "Maybe", "OneOf", "Seq", "read_syntax", "alternatives", "docs_reply"]


class SyntaxProblem(ValueError):
    """A syntax line that breaks the notation."""


@dataclass(frozen=True)
class Word:
    """A token (upper case, typed as it is) or a value (lower case); ``many``: ``x [x ...]``."""

    text: str
    many: bool = False

    @property
    def token(self) -> bool:
        return self.text.upper() == self.text and any(c.isalpha() for c in self.text)


@dataclass(frozen=True)
class Maybe:
    """``[...]``."""

    body: "Part"


@dataclass(frozen=True)
class OneOf:
    """``A|B`` (words) or ``a b | c`` (argument lists)."""

    choices: tuple["Part", ...]


@dataclass(frozen=True)
class Seq:
    """Arguments one after the other; ``many``: the whole list repeats (``STATE state [STATE state ...]``)."""

    items: tuple["Part", ...]
    many: bool = False


Part = Union[Word, Maybe, OneOf, Seq]


def _tokens(line: str) -> list[str]:
    out: list[str] = []
    for word in line.split():
        while word.startswith("["):
            out.append("[")
            word = word[1:]
        closing = 0
        while word.endswith("]"):
            closing += 1
            word = word[:-1]
        if word:
            out.append(word)
        out += ["]"] * closing
    return out


def _same(a: tuple["Part", ...], b: tuple["Part", ...]) -> bool:
    return len(a) == len(b) and all(_plain(x) == _plain(y) for x, y in zip(a, b))


def _plain(node: "Part") -> "Part":
    return Word(node.text) if isinstance(node, Word) else node


def _one(items: list["Part"]) -> "Part":
    return items[0] if len(items) == 1 else Seq(tuple(items))


def _parse(tokens: list[str], at: int, line: str) -> tuple["Part", int]:
    """A list (with `` | `` alternatives) from ``tokens[at]`` to a ``]`` or the end."""
    choices: list[list[Part]] = [[]]
    while at < len(tokens) and tokens[at] != "]":
        tok = tokens[at]
        at += 1
        items = choices[-1]
        if tok == "[":
            body, at = _parse(tokens, at, line)
            if at >= len(tokens):
                raise SyntaxProblem("%r: a [ is never closed" % line)
            at += 1  # the ]
            inner = body.items if isinstance(body, Seq) else (body,)
            if inner and inner[-1] == Word("..."):  # x [x ...]: the items before repeat
                repeated = inner[:-1]
                if not repeated or not _same(tuple(items[-len(repeated):]), repeated):
                    raise SyntaxProblem("%r: [x ...] must repeat what comes just before it" % line)
                del items[-len(repeated):]
                items.append(Word(repeated[0].text, many=True) if len(repeated) == 1 and isinstance(repeated[0], Word)
                             else Seq(tuple(repeated), many=True))  # fmt: skip
            else:
                if not inner:
                    raise SyntaxProblem("%r: [] holds nothing" % line)
                items.append(Maybe(body))
        elif tok == "|":
            if not items:
                raise SyntaxProblem("%r: an alternative is empty" % line)
            choices.append([])
        elif "|" in tok:
            words = tok.split("|")
            if not all(words):
                raise SyntaxProblem("%r: an empty choice in %r" % (line, tok))
            items.append(OneOf(tuple(Word(w) for w in words)))
        elif tok == "..." or tok.islower() or tok.isupper() or not any(c.isalpha() for c in tok):
            items.append(Word(tok))
        else:
            raise SyntaxProblem("%r: %r is neither a token (upper case) nor a value (lower case)" % (line, tok))
    if choices == [[]]:
        return Seq(()), at  # nothing before a ] (or the end): the caller says what is wrong
    if not choices[-1]:
        raise SyntaxProblem("%r: an alternative is empty" % line)
    if len(choices) == 1:
        return _one(choices[0]), at
    return OneOf(tuple(_one(c) for c in choices)), at


def read_syntax(spec: CommandSpec) -> tuple["Part", ...]:
    """The arguments of ``spec.syntax`` (after the command's name), read; SyntaxProblem if the
    line breaks the notation or does not start with the name."""
    line = spec.syntax
    tokens = _tokens(line)
    if not tokens or tokens[0] != spec.name.decode().upper():
        raise SyntaxProblem("%r must start with %s" % (line, spec.name.decode().upper()))
    if tokens.count("[") != tokens.count("]"):
        raise SyntaxProblem("%r: the brackets do not pair" % line)
    if len(tokens) == 1:
        return ()
    node, at = _parse(tokens, 1, line)
    if at != len(tokens):
        raise SyntaxProblem("%r: a ] closes nothing" % line)
    for word in _words(node):
        if word.text == "...":
            raise SyntaxProblem("%r: ... only as in x [x ...]" % line)
    return node.items if isinstance(node, Seq) and not node.many else (node,)


def _words(node: "Part") -> Iterable[Word]:
    if isinstance(node, Word):
        yield node
    elif isinstance(node, Maybe):
        yield from _words(node.body)
    else:
        for child in node.choices if isinstance(node, OneOf) else node.items:
            yield from _words(child)


def alternatives(spec: CommandSpec) -> list[str]:
    """The forms of a command with subcommands, each a line of its own: ``CONFIG GET parameter``,
    ``CONFIG SET parameter value`` ...; a command without is its one syntax line."""
    name, _, rest = spec.syntax.partition(" ")
    depth, start, out = 0, 0, []
    for i, c in enumerate(rest):
        depth += c == "["
        depth -= c == "]"
        if depth == 0 and rest.startswith(" | ", i):
            out.append(rest[start:i])
            start = i + 3
    out.append(rest[start:])
    return [(name + " " + form).strip() for form in out]


# ----------------------------------------------------------------------------- Redis 7's shape

_OPTIONAL = Status(b"optional")
_MULTIPLE = Status(b"multiple")
_MULTIPLE_TOKEN = Status(b"multiple_token")


def _name(node: "Part") -> str:
    if isinstance(node, Word):
        return node.text.lower()
    if isinstance(node, Maybe):
        return _name(node.body)
    parts = node.choices if isinstance(node, OneOf) else node.items
    return "-".join(_name(p) for p in parts if not (isinstance(p, Word) and p.text == "..."))


def _argument(node: "Part", flags: list[Status]) -> dict[bytes, object]:
    """One of Redis 7's argument maps."""
    out: dict[bytes, object] = {}
    if isinstance(node, Maybe):
        return _argument(node.body, flags + [_OPTIONAL])
    if isinstance(node, Word):
        if node.many:
            flags = flags + [_MULTIPLE]
        if node.token:
            out = {b"name": node.text.lower().encode(), b"type": b"pure-token", b"token": node.text.encode()}
        else:
            out = {b"name": node.text.encode(), b"type": b"string"}
    elif isinstance(node, OneOf):
        out = {b"name": _name(node).encode(), b"type": b"oneof",
               b"arguments": [_argument(c, []) for c in node.choices]}  # fmt: skip
    else:
        items = list(node.items)
        token = None
        first = items[0]
        if isinstance(first, Word) and first.token and len(items) > 1:
            token = first.text  # TOKEN value: the value's token (Redis's [COUNT count])
            del items[0]
        if node.many:
            flags = flags + ([_MULTIPLE, _MULTIPLE_TOKEN] if token else [_MULTIPLE])
        if token is None and len(items) == 1:  # one part repeated: IN|OUT [IN|OUT ...]
            return _argument(items[0], flags)
        only = items[0]
        if len(items) == 1 and isinstance(only, Word) and not only.token and not only.many:
            out = {b"name": only.text.encode(), b"type": b"string"}
        else:
            out = {b"name": _name(node).encode(), b"type": b"block", b"arguments": [_argument(i, []) for i in items]}
        if token is not None:
            out[b"token"] = token.encode()
    if flags:
        out[b"flags"] = flags
    return out


def docs_reply(specs: Iterable[CommandSpec]) -> dict[bytes, dict[bytes, object]]:
    """COMMAND DOCS' entries, name -> its map (Redis 7): summary, since, group, arguments."""
    out: dict[bytes, dict[bytes, object]] = {}
    for spec in specs:
        doc: dict[bytes, object] = {b"summary": spec.summary.encode(), b"since": spec.since.encode(),
                                    b"group": spec.group.encode()}  # fmt: skip
        args = read_syntax(spec)
        if args:
            doc[b"arguments"] = [_argument(node, []) for node in args]
        out[spec.name] = doc
    return out
