"""The suite's checks of itself: no skip in silence, and a compiled pass that ran compiled code.

**Skips.** A test skips when something it needs is missing (Java, Chromium, redis-cli, a tool
of the system), and pytest still exits 0. ``tests/skips.toml`` lists every skip that a whole
run of ``scripts/test`` expects (its test, its reason, how many in each pass, and why), and
nothing else may skip unnoticed:

* every pytest run (this module's hooks, which ``tests/conftest.py`` takes in) prints each
  skip the list does not name, its test and its reason, under
  ``UNEXPECTED SKIPS``; with ``DISQUE_PY_CI=1`` (``.ci/run``) they fail the run;
* with ``DISQUE_PY_SKIPS_OUT=FILE`` the run's skips are written to FILE (JSON); after a whole
  run ``scripts/test`` compares the two passes' files with the list, count by count
  (``python -m tests.ci skips compiled=FILE pure=FILE``): one line, ``skips: N expected,
  M found``, then every difference; with ``DISQUE_PY_CI=1`` a difference fails the run.

**The build.** ``scripts/test`` sets ``DISQUE_PY_EXPECT_BUILD=compiled`` for the pass that
should run the compiled build (when ``scripts/build`` made a current one) and ``pure`` for
the pure pass; :func:`pytest_sessionstart` then checks, before any test runs, that every module of
``_build.all_modules()`` was loaded from its extension file (pure: from its source), and, in
the process that reports, that a node started as the tests start theirs says
``build:compiled (...)`` (pure: ``build:pure (...)``) in INFO server. Anything else ends the
run at once, saying what ran instead.

**The pure pass** runs the tests listed in ``tests/pure_pass.txt`` (see there;
``python -m tests.ci pure-pass`` prints the paths).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import pytest

HERE = Path(__file__).resolve().parent
EXPECTED_SKIPS = HERE / "skips.toml"
PURE_PASS = HERE / "pure_pass.txt"
PASSES = ("compiled", "pure")
CI_ENV = "DISQUE_PY_CI"
SKIPS_OUT_ENV = "DISQUE_PY_SKIPS_OUT"
EXPECT_BUILD_ENV = "DISQUE_PY_EXPECT_BUILD"

Skip = tuple[str, str]  # (node ID, reason)


def in_ci() -> bool:
    return os.environ.get(CI_ENV, "") not in ("", "0")


# --------------------------------------------------------------------------- the list


@dataclass(frozen=True)
class Expected:
    """One entry of tests/skips.toml: the skips of ``test`` (a node ID; ``*`` stands for any
    text) that give exactly ``reason``, ``counts[pass]`` of them in each pass."""

    test: str
    reason: str
    counts: dict[str, int]
    why: str

    def matches(self, nodeid: str, reason: str) -> bool:
        pattern = ".*".join(re.escape(part) for part in self.test.split("*"))
        return reason == self.reason and re.fullmatch(pattern, nodeid) is not None


def load_expected(path: Path = EXPECTED_SKIPS) -> list[Expected]:
    """The entries of ``path``; ValueError naming the entry when one is malformed."""
    data = tomllib.loads(path.read_text())
    entries = []
    for i, raw in enumerate(data.get("skip", []), 1):
        where = "%s, skip #%d" % (path.name, i)
        unknown = set(raw) - {"test", "reason", "why", *PASSES}
        if unknown:
            raise ValueError("%s: unknown keys %s" % (where, sorted(unknown)))
        for key in ("test", "reason", "why"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise ValueError("%s: %r must be a non-empty string" % (where, key))
        counts = {p: raw.get(p, 0) for p in PASSES}
        whole = all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts.values())
        if not whole or not any(counts.values()):
            raise ValueError("%s: the counts (%s) must be whole numbers, one above 0" % (where, ", ".join(PASSES)))
        entries.append(Expected(raw["test"], raw["reason"], counts, raw["why"]))
    seen = set()
    for e in entries:
        if (e.test, e.reason) in seen:
            raise ValueError("%s: %s with %r is listed twice" % (path.name, e.test, e.reason))
        seen.add((e.test, e.reason))
    return entries


def entry_of(skip: Skip, expected: Iterable[Expected]) -> Expected | None:
    return next((e for e in expected if e.matches(*skip)), None)


# --------------------------------------------------------------------------- one pytest run


def reason_of(report: pytest.TestReport | pytest.CollectReport) -> str:
    """A skip's reason as ``pytest.skip`` was given it (pytest's own -rs line, without "Skipped: ")."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def skips_of(config: pytest.Config) -> list[Skip]:
    """Every skip of the run, as pytest counts them at the end ("N skipped")."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return []
    return [(_without_group(r.nodeid), reason_of(r)) for r in reporter.stats.get("skipped", ())]


def _without_group(nodeid: str) -> str:
    """A test's ID without the ``@group`` pytest-xdist's --dist loadgroup adds (the Spark, chaos,
    browser ... tests run in a worker of their own group: their IDs end ``@spark`` under
    scripts/test, not in one process)."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") and at > nodeid.rfind("::") else nodeid


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")  # pytest-xdist: the controller reports for everyone


_UNEXPECTED = pytest.StashKey[list[Skip]]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """At the end of a run: the skips to the file ``DISQUE_PY_SKIPS_OUT`` names; those the list
    lacks kept for the summary, and made a failure in CI."""
    config = session.config
    if _is_worker(config):
        return
    skips = skips_of(config)
    out = os.environ.get(SKIPS_OUT_ENV)
    if out:
        Path(out).write_text(json.dumps([list(s) for s in skips], indent=1))
    expected = load_expected()
    unexpected = [s for s in skips if entry_of(s, expected) is None]
    config.stash[_UNEXPECTED] = unexpected
    if unexpected and in_ci() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    reporter = terminalreporter
    unexpected = config.stash.get(_UNEXPECTED, [])
    if not unexpected:
        return
    verdict = "they fail the run (%s=1)" % CI_ENV if in_ci() else "in CI (%s=1) they would fail the run" % CI_ENV
    listed = EXPECTED_SKIPS.relative_to(HERE.parent)
    reporter.write_sep("!", "UNEXPECTED SKIPS: %d (not in %s)" % (len(unexpected), listed), red=True, bold=True)
    for nodeid, reason in unexpected:
        reporter.write_line("SKIPPED %s: %s" % (nodeid, reason), red=True)
    reporter.write_line("%s; install what they need, or list them with the reason they are expected" % verdict,
                        red=True, bold=True)  # fmt: skip


# --------------------------------------------------------------------------- a whole run's two passes


@dataclass
class Comparison:
    expected: dict[str, int]  # per pass
    found: dict[str, int]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        per_pass = ", ".join("%s %d of %d" % (p, self.found[p], self.expected[p]) for p in PASSES)
        return "skips: %d expected, %d found (%s)%s" % (
            sum(self.expected.values()), sum(self.found.values()), per_pass,
            "" if self.ok else ": %d difference%s" % (len(self.problems), "" if len(self.problems) == 1 else "s"),
        )  # fmt: skip


def compare(found: dict[str, list[Skip]], expected: list[Expected]) -> Comparison:
    """Each pass's skips against the list: every skip listed, every entry's count exact."""
    problems: list[str] = []
    for p in PASSES:
        counts: dict[int, int] = {}
        for skip in found.get(p, []):
            entry = entry_of(skip, expected)
            if entry is None:
                problems.append("%s pass: unexpected skip %s: %s" % (p, *skip))
            else:
                counts[id(entry)] = counts.get(id(entry), 0) + 1
        for e in expected:
            n = counts.get(id(e), 0)
            if n != e.counts[p]:
                problems.append("%s pass: %s %r: %d expected, %d found" % (p, e.test, e.reason, e.counts[p], n))
    return Comparison({p: sum(e.counts[p] for e in expected) for p in PASSES},
                      {p: len(found.get(p, [])) for p in PASSES}, problems)  # fmt: skip


def _skips_main(args: list[str]) -> int:
    found: dict[str, list[Skip]] = {}
    for arg in args:
        name, _, path = arg.partition("=")
        if name not in PASSES or not path:
            raise SystemExit("usage: python -m tests.ci skips compiled=FILE pure=FILE")
        try:
            found[name] = [tuple(s) for s in json.loads(Path(path).read_text())]  # type: ignore[misc]
        except (OSError, ValueError) as exc:
            print(">> %s pass: no record of its skips (%s): did it run to the end?" % (name, exc), file=sys.stderr)
            return 1
    if set(found) != set(PASSES):
        raise SystemExit("usage: python -m tests.ci skips compiled=FILE pure=FILE")
    result = compare(found, load_expected())
    print(">> " + result.line(), file=sys.stderr)
    for problem in result.problems:
        print(">>   " + problem, file=sys.stderr)
    if result.ok:
        return 0
    if in_ci():
        print(">> the skips differ from %s: the run fails (%s=1)" % (EXPECTED_SKIPS.relative_to(HERE.parent), CI_ENV),
              file=sys.stderr)  # fmt: skip
        return 1
    print(">> (outside CI the run still passes; in CI, %s=1, it would fail)" % CI_ENV, file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- the build each pass runs


def pure_pass(path: Path = PURE_PASS) -> dict[str, list[str]]:
    """tests/pure_pass.txt: each test path the pure pass runs -> the compiled modules it tests."""
    out: dict[str, list[str]] = {}
    last = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0].isspace():
            if last is None:
                raise ValueError("%s:%d: a continuation before any path" % (path.name, number))
            out[last] += line.split()
            continue
        where, colon, modules = line.partition(":")
        if not colon or where.strip() in out:
            raise ValueError("%s:%d: expected 'PATH: MODULE...' (each path once)" % (path.name, number))
        last = where.strip()
        out[last] = modules.split()
    return out


def module_problems(mode: str) -> list[str]:
    """What is wrong with the modules this process loaded, for the build ``mode`` expected: each
    compiled module from its extension file (compiled) or from its source (pure)."""
    import importlib

    from disque_py import _build

    problems = []
    for name in _build.all_modules():
        module = importlib.import_module(name)
        where = os.path.realpath(getattr(module, "__file__", None) or "?")
        ext = _build.extension_path(name)
        want = os.path.realpath(ext) if mode == "compiled" and ext else os.path.realpath(_build.source_path(name))
        if mode == "compiled" and ext is None:
            problems.append("%s has no extension file" % name)
        elif where != want:
            problems.append("%s was loaded from %s, not %s" % (name, where, want))
    described = _build.describe()
    if not described.startswith(mode + " ("):
        problems.append("the build says %r" % described)
    return problems


def node_build() -> str:
    """INFO server's ``build`` of a node started as the tests start theirs (tests/integration);
    AssertionError if it does not start, or does not stop on SIGTERM."""
    import shutil
    import tempfile

    from tests.integration.conftest import NodeProcess, stop_all

    tmp = Path(tempfile.mkdtemp(prefix="disque-build-check-"))
    node = NodeProcess(tmp)
    try:
        node.start()
        return str(node.client().info("server")["build"])
    finally:
        try:
            stop_all([node])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def pytest_sessionstart(session: pytest.Session) -> None:
    """``DISQUE_PY_EXPECT_BUILD`` set: end the run at once unless it runs that build."""
    mode = os.environ.get(EXPECT_BUILD_ENV, "")
    if not mode:
        return
    if mode not in PASSES:
        raise pytest.UsageError("%s=%s: compiled or pure" % (EXPECT_BUILD_ENV, mode))
    problems = module_problems(mode)
    if not problems and not _is_worker(session.config):
        try:
            build = node_build()
        except (AssertionError, pytest.fail.Exception) as exc:
            problems.append("a node started as the tests start theirs: %s" % exc)
        else:
            if not build.startswith(mode + " ("):
                problems.append("a node started by the tests says build:%s in INFO server" % build)
    if problems:
        pytest.exit("this pass should run the %s build (%s=%s), and does not:\n  %s"
                    % (mode, EXPECT_BUILD_ENV, mode, "\n  ".join(problems)), returncode=3)  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["skips"]:
        sys.exit(_skips_main(sys.argv[2:]))
    if sys.argv[1:2] == ["pure-pass"]:
        print("\n".join(pure_pass()))
        sys.exit(0)
    raise SystemExit("usage: python -m tests.ci skips compiled=FILE pure=FILE | pure-pass")
