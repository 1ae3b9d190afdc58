"""One progress bar per benchmark run, over its cells or rounds, on stderr.

Only on a terminal: when stderr is a file or a pipe (CI, ``2> log``) nothing
is drawn and the run's own lines come out as before. The bar is the CLI's
(click's, as ``check-aof`` and ``cluster create`` draw theirs). Lines printed
while it is drawn go through :func:`echo`, which clears the bar's line first
and draws it again after, so the two do not mix.

    with progress.bar(len(cells), "ADDJOB with the AOF") as bar:
        for cell in cells:
            bar.doing(cell.name)     # shown beside the bar
            run(cell)
            bar.done()
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import click

__all__ = ["bar", "echo", "enabled"]

_active: "Bar | None" = None


def enabled() -> bool:
    """A bar is drawn only on a terminal, and not with DISQUE_BENCH_PROGRESS=0."""
    if os.environ.get("DISQUE_BENCH_PROGRESS", "") == "0":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class Bar:
    """A step counter; draws when given click's bar, else only counts."""

    def __init__(self, length: int, label: str, drawn: Any = None) -> None:
        self.length = length
        self.label = label
        self.count = 0
        self._drawn = drawn

    def doing(self, what: str) -> None:
        """Name the step that runs now (beside the label)."""
        if self._drawn is not None:
            self._drawn.label = "%s: %s" % (self.label, what) if what else self.label
            self._drawn.render_progress()

    def done(self, n: int = 1) -> None:
        self.count += n
        if self._drawn is not None:
            self._drawn.update(n)

    def redraw(self) -> None:
        if self._drawn is not None:
            self._drawn.render_progress()


@contextlib.contextmanager
def bar(length: int, label: str) -> Iterator[Bar]:
    """A bar of ``length`` steps for one run (not drawn off a terminal, see :func:`enabled`)."""
    global _active
    if not enabled() or length <= 0:
        yield Bar(length, label)
        return
    with click.progressbar(length=length, label=label, file=sys.stderr, show_eta=True, show_pos=True,
                           width=24) as drawn:  # fmt: skip
        previous, _active = _active, Bar(length, label, drawn)
        try:
            yield _active
        finally:
            _active = previous


def echo(line: str, *, err: bool = True) -> None:
    """Print a line without tearing the bar being drawn (stderr unless ``err`` is False)."""
    stream = sys.stderr if err else sys.stdout
    if _active is not None:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()
    print(line, file=stream, flush=True)
    if _active is not None:
        _active.redraw()
