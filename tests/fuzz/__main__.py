"""``python -m tests.fuzz``: coverage-guided fuzzing of disque-py's parsers (``scripts/fuzz``)."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import click

from . import CORPUS, CRASHES, TARGETS, WORK, target_module

TARGET_HELP = """\b
Targets (tests/fuzz/fuzz_<name>.py):
  resp      client request parser (protocol/resp.py): only ProtocolError, limits kept,
            the same commands however a well-formed stream is cut
  commands  a core Node running random requests of its commands (and timers, closed
            clients, peers' job messages): never raises, replies encode, invariants hold
  bus       cluster bus frames, messages, the secret handshake and sealed sessions
            (cluster_bus/codec.py), and what membership and the node make of a message
  aof       the AOF record reader, the loader into a node, and check-aof
            (persistence/): only CorruptRecord or a truncated tail, invariants hold
What an input means to each target (RESP text, frames after a mode byte, AOF records
with checksum placeholders) is told at the top of its module."""


@click.group(help=f"""Fuzz disque-py's parsers of untrusted bytes with atheris (libFuzzer for Python).

\b
  scripts/fuzz                         every target, 1 minute in all
  scripts/fuzz --minutes 60            an hour, split across the targets
  scripts/fuzz --target aof --minutes 10
  scripts/fuzz replay                  run every committed input once (no atheris needed)

{TARGET_HELP}

\b
Each run starts from the committed seeds (tests/fuzz/corpus/TARGET/) and past failures
(tests/fuzz/crashes/TARGET/), plus the inputs earlier runs found interesting
(tests/fuzz/work/TARGET/, not committed, kept between runs: longer runs build on shorter
ones). An input that fails is saved in tests/fuzz/crashes/TARGET/: commit it with the
fix; tests/fuzz/test_corpus.py replays it from then on. The test suite runs each target
for 12 s (tests/fuzz/test_fuzz_bounded.py).""")
def cli() -> None:
    pass


@cli.command(help=f"Fuzz for a while; failing inputs are saved in tests/fuzz/crashes/TARGET/.\n\n{TARGET_HELP}")
@click.option("--minutes", type=float, default=1.0, show_default=True,
              help="Total time, split evenly across the targets.")  # fmt: skip
@click.option("--target", "targets", multiple=True, type=click.Choice(sorted(TARGETS)),
              help="Only this target (repeatable). Default: all.")  # fmt: skip
@click.option("--runs", type=int, default=None, help="Stop each target after this many inputs instead.")
@click.option("--seed", type=int, default=None, help="libFuzzer's random seed (to repeat a run).")
@click.option("--fresh", is_flag=True, help="Forget the working corpus of earlier runs first.")
def run(minutes: float, targets: tuple[str, ...], runs: int | None, seed: int | None, fresh: bool) -> None:
    from .runner import atheris_missing, run_target

    missing = atheris_missing()
    if missing:
        raise click.ClickException(missing)
    names = list(targets) or sorted(TARGETS)
    seconds = None if runs is not None else max(1.0, minutes * 60 / len(names))
    budget = f"{runs} inputs" if runs is not None else f"{seconds:.0f} s"
    click.echo(f">> fuzzing {', '.join(names)}: {budget} each", err=True)
    failed: list[tuple[str, list[Path]]] = []
    for name in names:
        work = WORK / name
        if fresh and work.exists():
            shutil.rmtree(work)
        click.echo(f">> {name}: starting from {_count(CORPUS / name)} seeds, {_count(CRASHES / name)} past crashes,"
                   f" {_count(work)} inputs of earlier runs", err=True)  # fmt: skip
        result = run_target(name, seconds=seconds, runs=runs, seed=seed, artifact_dir=CRASHES / name, work_dir=work,
                            progress=lambda line: click.echo("   " + line, err=True))  # fmt: skip
        verdict = "ok" if result.ok else "FAILED"
        click.echo(f">> {name}: {verdict}: {result.execs} inputs in {result.seconds:.0f} s ({result.exec_per_sec}/s),"
                   f" working corpus {_count(work)} inputs", err=True)  # fmt: skip
        if not result.ok:
            click.echo("\n".join("   | " + line for line in result.tail[-30:]), err=True)
            failed.append((name, result.artifacts))
    if failed:
        click.echo("\n>> failing inputs were saved:", err=True)
        for name, paths in failed:
            for path in paths or [Path("(none written: see the output above)")]:
                click.echo(f"   {name}: {path}", err=True)
        click.echo(">> replay one with: python -m tests.fuzz replay --target NAME FILE\n"
                   ">> fix the code, then commit the input with the fix: tests/fuzz/test_corpus.py replays it"
                   " in every test run.", err=True)  # fmt: skip
        sys.exit(1)


@cli.command(help="Run committed inputs (or the FILES given) through their target once, in this process.")
@click.option("--target", "targets", multiple=True, type=click.Choice(sorted(TARGETS)),
              help="Only this target (repeatable). Default: all.")  # fmt: skip
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def replay(targets: tuple[str, ...], files: tuple[Path, ...]) -> None:
    names = list(targets) or sorted(TARGETS)
    if files and len(names) != 1:
        raise click.UsageError("give one --target for the FILES")
    bad = 0
    for name in names:
        module = target_module(name)
        paths = list(files) or sorted(p for d in (CORPUS / name, CRASHES / name) if d.is_dir()
                                      for p in d.iterdir() if p.is_file() and not p.name.startswith("."))  # fmt: skip
        for path in paths:
            start = time.monotonic()
            try:
                module.TestOneInput(path.read_bytes())
            except Exception as exc:
                bad += 1
                click.echo(f"FAIL {name} {path}: {type(exc).__name__}: {exc}"[:2000])
            else:
                click.echo(f"ok   {name} {path} ({(time.monotonic() - start) * 1000:.1f} ms)")
    if bad:
        sys.exit(1)


@cli.command(help="Write the seeds of tests/fuzz/corpus/ again from tests/fuzz/seeds.py.")
def seeds() -> None:
    from . import seeds as maker

    for name in sorted(maker.MAKERS):
        for path in maker.write(name):
            click.echo(str(path))


def _count(folder: Path) -> int:
    return sum(1 for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")) if folder.is_dir() else 0


if __name__ == "__main__":
    cli(prog_name="scripts/fuzz")
