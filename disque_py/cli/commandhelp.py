"""``help`` at ``disque-py cli``'s prompt (and ``disque-py cli help ...``), and its tab completion.

Answered here, not by the node, so it works with the node down or unreachable: every command a
node answers is declared once (``core/commandspec.py``, gathered in ``server/app.py``'s
``NODE_COMMANDS``), with its syntax, a one-line summary, its group and the ACL categories
that grant it; this module only prints them, as redis-cli 7's ``help`` does:

* ``help``: how to ask, the groups and the rights;
* ``help ADDJOB`` (any case): its syntax, summary, since, group and rights; a command with
  subcommands shows one line per form, and ``help CLUSTER MEET`` only that form;
* ``help @jobs``: the commands of a group (jobs, queues, workers, cluster, connection,
  server: what a command is about, as Redis's groups); ``help @consume``: what one of the
  ACL categories grants (produce, consume, inspect, admin: what an operator grants a user),
  down to the subcommands named apart (``WORKER LIST`` is @inspect's, not @consume's);
* anything else: one line saying so.

:func:`complete` gives the prompt's completions (readline): command names first, then a
command's subcommands; after ``help``, the groups and rights too.

Imported only when ``help`` or Tab is used: the declarations come with the node's modules.
"""

from __future__ import annotations

from .. import __version__
from ..core.commandspec import ALWAYS, GROUPS, CommandSpec
from ..server.acl import CATEGORY_NAMES
from ..server.app import NODE_COMMANDS
from ..server.commanddocs import alternatives

__all__ = ["help_text", "complete", "HELP_WORDS"]

#: What asks for help instead of sending a command (redis-cli's words).
HELP_WORDS = ("help", "?")

_SPECS: dict[str, CommandSpec] = {spec.name.decode(): spec for spec in NODE_COMMANDS}


def _intro() -> str:
    return (
        "disque-py cli %s\n"
        "To get help about the node's commands type:\n"
        '      "help @<group>" to get a list of commands in <group>\n'
        '      "help <command>" for help on <command>\n'
        '      "help <tab>" to get a list of possible help topics\n'
        '      "quit" to exit\n'
        "\n"
        "Groups: %s\n"
        "Rights (ACL categories): %s\n"
        % (__version__, " ".join("@" + g for g in GROUPS), " ".join("@" + c for c in CATEGORY_NAMES))
    )


def _sub_rights(spec: CommandSpec, form: str) -> tuple[str, ...]:
    """The ACL categories of one form (``WORKER LIST ...``): its subcommand's, if named apart."""
    words = form.split()
    if len(words) > 1:
        return dict(spec.subcommands).get(words[1].lower(), spec.acl)
    return spec.acl


def _say_rights(acl: tuple[str, ...]) -> str:
    if acl == ALWAYS:
        return "any connection"
    names = ["@" + c for c in acl]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _rights(spec: CommandSpec) -> str:
    out = [_say_rights(spec.acl)]
    apart: dict[tuple[str, ...], list[str]] = {}
    for sub, acl in spec.subcommands:
        if acl != spec.acl:
            apart.setdefault(acl, []).append(sub.upper())
    out += ["%s: %s" % (", ".join(subs), _say_rights(acl)) for acl, subs in apart.items()]
    return "; ".join(out)


def _wrap(line: str, width: int | None, indent: int) -> str:
    """``line`` cut at spaces outside brackets to fit ``width`` (None: as it is)."""
    if width is None or len(line) + 2 <= width:
        return line
    pieces, depth, start = [], 0, 0
    for i, c in enumerate(line):
        depth += c == "["
        depth -= c == "]"
        if c == " " and depth == 0:
            pieces.append(line[start:i])
            start = i + 1
    pieces.append(line[start:])
    lines = [pieces[0]]
    for piece in pieces[1:]:
        if len(lines[-1]) + 1 + len(piece) + 2 + (indent if len(lines) > 1 else 0) > width:
            lines.append(piece)
        else:
            lines[-1] += " " + piece
    return ("\n  " + " " * indent).join(lines)


def _entry(spec: CommandSpec, forms: list[str], *, group: bool, width: int | None) -> str:
    indent = len(spec.name) + 1
    out = ["", *("  " + _wrap(form, width, indent) for form in forms), "  summary: " + spec.summary,
           "  since: " + spec.since]  # fmt: skip
    if group:
        out.append("  group: " + spec.group)
    out.append("  rights: " + _rights(spec))
    return "\n".join(out) + "\n"


def help_text(words: list[str], width: int | None = None) -> tuple[str, bool]:
    """What ``help <words>`` prints, and False when it names nothing known. ``width``: the
    terminal's, to cut long syntax lines at (None: one line each)."""
    if not words or (len(words) == 1 and words[0].lower() in HELP_WORDS):
        return _intro(), True
    first = words[0].lower()
    if first.startswith("@") and len(words) == 1:
        topic = first[1:]
        if topic in GROUPS:
            specs = sorted((s for s in NODE_COMMANDS if s.group == topic), key=lambda s: s.name)
            return "".join(_entry(s, alternatives(s), group=False, width=width) for s in specs) + "\n", True
        if topic in CATEGORY_NAMES:
            out = ["Commands the @%s right grants (ACL SETUSER name +@%s):\n" % (topic, topic)]
            for spec in sorted(NODE_COMMANDS, key=lambda s: s.name):
                granted = [f for f in alternatives(spec) if topic in _sub_rights(spec, f)]
                if granted:
                    out.append(_entry(spec, granted, group=True, width=width))
            return "".join(out) + "\n", True
        return ("No help for %r: the groups are %s, the rights %s\n"
                % (words[0], " ".join("@" + g for g in GROUPS), " ".join("@" + c for c in CATEGORY_NAMES)),
                False)  # fmt: skip
    command = _SPECS.get(first)
    if command is None:
        return ("No help for %r: not a command of the node. Try \"help\" (the groups), \"help @<group>\" or "
                "\"help <command>\"\n" % " ".join(words), False)  # fmt: skip
    forms = alternatives(command)
    if len(words) > 1:  # help CLUSTER MEET: that subcommand's forms
        subs = _subcommands(command)
        forms = [f for f in forms if f.split()[1:2] == [words[1].upper()]]
        if not forms:
            return ("No help for %r: %s has %s\n" % (" ".join(words), first.upper(), "the subcommands " + ", ".join(subs)
                    if subs else "no subcommands"), False)  # fmt: skip
    return _entry(command, forms, group=True, width=width) + "\n", True


def _subcommands(spec: CommandSpec) -> list[str]:
    forms = alternatives(spec)
    if len(forms) == 1:
        return []
    return list(dict.fromkeys(f.split()[1] for f in forms))


def complete(before: str, text: str) -> list[str]:
    """The completions of ``text``, the word being typed, after ``before`` (the line up to it)."""
    words = before.split()
    lower = bool(text) and text.islower()
    names = [spec.name.decode().upper() for spec in NODE_COMMANDS]
    if not words:
        pool = names
    elif words[0].lower() in HELP_WORDS and len(words) == 1:
        pool = ["@" + g for g in GROUPS] + ["@" + c for c in CATEGORY_NAMES] + names
    elif words[0].lower() in HELP_WORDS and len(words) == 2 and words[1].lower() in _SPECS:
        pool = _subcommands(_SPECS[words[1].lower()])
    elif len(words) == 1 and words[0].lower() in _SPECS:
        pool = _subcommands(_SPECS[words[0].lower()])
    else:
        pool = []
    want = text.lower()
    return [(c.lower() if lower else c) + " " for c in pool if c.lower().startswith(want)]
