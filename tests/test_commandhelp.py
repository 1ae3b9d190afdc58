"""`disque-py cli`'s help and completion (cli/commandhelp.py), in process: what Tab offers where,
and long syntax lines cut for a terminal only between arguments. The cli itself, node up and down,
is tests/integration/test_cli_help.py."""

from __future__ import annotations

from disque_py.cli.commandhelp import complete, help_text
from disque_py.server.app import NODE_COMMANDS


def test_tab_offers_the_commands_then_their_subcommands():
    assert complete("", "QL") == ["QLEN "]
    assert complete("", "QS") == ["QSTAT ", "QSCAN "]
    assert complete("", "qs") == ["qstat ", "qscan "]  # the case typed
    assert len(complete("", "")) == len(NODE_COMMANDS)
    assert complete("CONFIG ", "") == ["GET ", "SET ", "REWRITE ", "RESETSTAT "]
    assert complete("client ", "k") == ["kill "]  # two forms, one subcommand
    assert complete("QLEN ", "") == [] and complete("CONFIG GET ", "") == [] and complete("", "nosuch") == []


def test_tab_after_help_offers_the_groups_rights_and_commands():
    assert complete("help ", "@") == ["@jobs ", "@queues ", "@workers ", "@cluster ", "@connection ", "@server ",
                                      "@produce ", "@consume ", "@inspect ", "@admin "]  # fmt: skip
    assert complete("HELP ", "@co") == ["@connection ", "@consume "]
    assert complete("help ", "ADDJ") == ["ADDJOB "]
    assert complete("help cluster ", "M") == ["MEET ", "MYID "]
    assert complete("help addjob ", "") == [] and complete("help cluster meet ", "") == []


def test_long_syntax_lines_are_cut_between_arguments_on_a_terminal():
    whole, _ = help_text(["jscan"])
    assert "  JSCAN [cursor] [COUNT count] [BUSYLOOP] [QUEUE queue] [STATE state [STATE state ...]] [REPLY ALL|ID]\n" in whole
    cut, known = help_text(["jscan"], width=60)
    assert known
    assert cut.splitlines()[1:4] == ["  JSCAN [cursor] [COUNT count] [BUSYLOOP] [QUEUE queue]",
                                     "        [STATE state [STATE state ...]] [REPLY ALL|ID]",
                                     "  summary: Iterate over this node's jobs, by queue and state"]  # fmt: skip
    assert cut.replace("\n        ", " ") == whole
