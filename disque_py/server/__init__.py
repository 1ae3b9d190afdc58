"""The trio shell around the sans-I/O core: sockets, timers, signals, and nothing else.

:mod:`.app` composes the parts and is imported by nobody here (the CLI
imports ``run_node``). The parts import only modules below them:
:mod:`.clients` (client loop, acceptor), :mod:`.dispatch` (commands and
effects), :mod:`.timers` (core timers, cron), :mod:`.cluster` (bus glue),
:mod:`.admin` (the shell's commands); under them :mod:`.contracts` (the
protocols they are typed by), :mod:`.connection`, :mod:`.waiting`,
:mod:`.gcpolicy`, :mod:`.fdlimit` and :mod:`.logs`.
"""
