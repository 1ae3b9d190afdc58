"""The suite's checks of itself (tests/ci.py): skips counted against tests/skips.toml, each pass
on the build it should run, the pure pass naming every compiled module; and two rules read off
the tests' source: a ``pytest.raises`` says which error, and a skip is listed or fails in CI."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from disque_py import _build
from tests import ci
from tests.test_contracts import import_graph, module_files

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the list and the count


def test_the_list_of_expected_skips_reads_and_each_entry_says_why():
    entries = ci.load_expected()
    assert entries and all(e.why.strip() and any(e.counts.values()) for e in entries)
    assert all(e.test.startswith("tests/") for e in entries)


@pytest.mark.parametrize("text, error", [
    ('[[skip]]\ntest = "t"\nreason = "r"\ncompiled = 1\n', "'why' must be a non-empty string"),
    ('[[skip]]\ntest = "t"\nreason = "r"\nwhy = "w"\n', "one above 0"),
    ('[[skip]]\ntest = "t"\nreason = "r"\nwhy = "w"\npure = -1\n', "must be whole numbers"),
    ('[[skip]]\ntest = "t"\nreason = "r"\nwhy = "w"\ncompiled = 1\nwhen = "x"\n', "unknown keys \\['when'\\]"),
    ('[[skip]]\ntest = "t"\nreason = "r"\nwhy = "w"\ncompiled = 1\n' * 2, "listed twice"),
])  # fmt: skip
def test_a_malformed_entry_is_refused_by_name(tmp_path, text, error):
    path = tmp_path / "skips.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        ci.load_expected(path)


def test_an_entry_matches_its_test_and_its_exact_reason_only():
    e = ci.Expected("tests/docs/test_docs.py::test_cannot[*]", "no tool", {"compiled": 2, "pure": 0}, "why")
    assert e.matches("tests/docs/test_docs.py::test_cannot[README.md:12 pip]", "no tool")
    assert not e.matches("tests/docs/test_docs.py::test_cannot[README.md:12 pip]", "no tool here")
    assert not e.matches("tests/docs/test_docs.py::test_other[x]", "no tool")
    assert not e.matches("tests/docs/test_docs.pyc::test_cannot[x]", "no tool")  # a dot is a dot
    assert ci.Expected("tests/a.py::test_x", "r", {"compiled": 1, "pure": 0}, "w").matches("tests/a.py::test_x", "r")


def test_the_count_is_exact_in_each_pass_and_a_skip_not_listed_is_named():
    listed = [
        ci.Expected("tests/a.py::test_replay_*", "by hand", {"compiled": 2, "pure": 2}, "w"),
        ci.Expected("tests/b.py::test_doc[*]", "elsewhere", {"compiled": 1, "pure": 0}, "w"),
    ]
    exact = {"compiled": [("tests/a.py::test_replay_x", "by hand"), ("tests/a.py::test_replay_y", "by hand"),
                          ("tests/b.py::test_doc[1]", "elsewhere")],
             "pure": [("tests/a.py::test_replay_x", "by hand"), ("tests/a.py::test_replay_y", "by hand")]}  # fmt: skip
    result = ci.compare(exact, listed)
    assert result.ok and result.line() == "skips: 5 expected, 5 found (compiled 3 of 3, pure 2 of 2)"
    off = {"compiled": exact["compiled"][:2] + [("tests/c.py::test_java", "no Java")], "pure": exact["pure"][:1]}
    result = ci.compare(off, listed)
    assert not result.ok
    assert result.problems == [
        "compiled pass: unexpected skip tests/c.py::test_java: no Java",
        "compiled pass: tests/b.py::test_doc[*] 'elsewhere': 1 expected, 0 found",
        "pure pass: tests/a.py::test_replay_* 'by hand': 2 expected, 1 found",
    ]
    assert result.line() == "skips: 5 expected, 4 found (compiled 3 of 3, pure 1 of 2): 3 differences"


def _skips_main(tmp_path, found: dict[str, list[list[str]]], ci_env: str):
    args = []
    for name, skips in found.items():
        (tmp_path / name).write_text(json.dumps(skips))
        args.append("%s=%s" % (name, tmp_path / name))
    env = {**os.environ, ci.CI_ENV: ci_env}
    return subprocess.run([sys.executable, "-m", "tests.ci", "skips", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_after_a_whole_run_a_difference_fails_in_ci_only(tmp_path):
    listed = ci.load_expected()
    exact = {p: [[e.test.replace("*", "x"), e.reason] for e in listed for _ in range(e.counts[p])] for p in ci.PASSES}
    out = _skips_main(tmp_path, exact, "1")
    total = sum(sum(e.counts.values()) for e in listed)
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith(">> skips: %d expected, %d found (" % (total, total)), out.stderr
    more = {**exact, "pure": exact["pure"] + [["tests/x.py::test_y", "chromium not found"]]}
    out = _skips_main(tmp_path, more, "1")
    assert out.returncode == 1, out.stderr
    assert "pure pass: unexpected skip tests/x.py::test_y: chromium not found" in out.stderr
    assert "the run fails (DISQUE_PY_CI=1)" in out.stderr
    out = _skips_main(tmp_path, more, "")
    assert out.returncode == 0 and "in CI, DISQUE_PY_CI=1, it would fail" in out.stderr, out.stderr
    (tmp_path / "pure").unlink()  # the pure pass left no record
    argv = [sys.executable, "-m", "tests.ci", "skips", *("%s=%s" % (p, tmp_path / p) for p in ci.PASSES)]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "pure pass: no record of its skips" in out.stderr, out.stderr


# --------------------------------------------------------------------------- in a pytest run


SKIPPING = '''
import pytest

def test_runs():
    pass

def test_needs_a_tool():
    pytest.skip("the tool is not installed")
'''


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """A pytest run of a small test file with this module's hooks (-p tests.ci), as the suite has them."""
    (tmp_path / "test_small.py").write_text(SKIPPING)
    base = {k: v for k, v in os.environ.items() if k not in (ci.CI_ENV, ci.SKIPS_OUT_ENV, ci.EXPECT_BUILD_ENV)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.ci", "-p", "no:cacheprovider", "-q",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_small.py")],
                          cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_skip_not_listed_is_printed_and_fails_the_run_in_ci_only(tmp_path):
    out = _pytest(tmp_path, DISQUE_PY_SKIPS_OUT=str(tmp_path / "skips.json"))
    assert out.returncode == 0, out.stdout
    assert "UNEXPECTED SKIPS: 1 (not in tests/skips.toml)" in out.stdout
    assert "SKIPPED test_small.py::test_needs_a_tool: the tool is not installed" in out.stdout
    assert "in CI (DISQUE_PY_CI=1) they would fail the run" in out.stdout
    assert json.loads((tmp_path / "skips.json").read_text()) == [["test_small.py::test_needs_a_tool",
                                                                  "the tool is not installed"]]  # fmt: skip
    out = _pytest(tmp_path, DISQUE_PY_CI="1")
    assert out.returncode == 1, out.stdout
    assert "1 passed, 1 skipped" in out.stdout and "they fail the run (DISQUE_PY_CI=1)" in out.stdout


def test_a_pass_on_another_build_than_expected_stops_at_once(tmp_path):
    out = _pytest(tmp_path, DISQUE_PY_PURE="1", DISQUE_PY_EXPECT_BUILD="compiled")
    assert out.returncode == 3, out.stdout + out.stderr
    said = out.stdout + out.stderr
    assert "this pass should run the compiled build (DISQUE_PY_EXPECT_BUILD=compiled), and does not" in said
    assert "disque_py.core.job was loaded from %s" % (ROOT / "disque_py" / "core" / "job.py") in said or (
        "disque_py.core.job has no extension file" in said)  # fmt: skip
    assert "1 passed" not in said  # no test ran
    # pure, as asked: the modules from their source, and a node that says so in INFO server
    out = _pytest(tmp_path, DISQUE_PY_PURE="1", DISQUE_PY_EXPECT_BUILD="pure")
    assert out.returncode == 0 and "1 passed, 1 skipped" in out.stdout, out.stdout + out.stderr


def test_the_compiled_pass_reports_where_each_module_came_from():
    mode = _build.describe().partition(" ")[0]  # what this very process decided
    assert ci.module_problems(mode) == []  # what this very process runs
    other = ci.module_problems("pure" if mode == "compiled" else "compiled")
    assert len(other) == len(_build.all_modules()) + 1 and other[-1].startswith("the build says '%s (" % mode)


# --------------------------------------------------------------------------- the pure pass


def test_the_pure_pass_names_every_compiled_module_by_a_path_that_imports_it():
    listed = ci.pure_pass()
    named = {m for modules in listed.values() for m in modules}
    assert set(_build.all_modules()) <= named, sorted(set(_build.all_modules()) - named)
    assert named <= set(_build.all_modules()), sorted(named - set(_build.all_modules()))
    graph, _ = import_graph(ROOT, ("disque_py", "cluster_bus", "tests"))
    tests = module_files(ROOT, ("tests",))
    for path, modules in listed.items():
        assert (ROOT / path).exists(), path
        reached: set[str] = set()
        todo = [m for m, f in tests.items() if f == ROOT / path or (ROOT / path) in f.parents]
        while todo:
            m = todo.pop()
            if m not in reached:
                reached.add(m)
                todo.extend(graph.get(m, ()))
        assert set(modules) <= reached, (path, sorted(set(modules) - reached))


def test_the_pure_pass_file_is_read_strictly(tmp_path):
    path = tmp_path / "pure_pass.txt"
    path.write_text("# a comment\ntests/a: x.y\n  x.z\ntests/b.py: x.w\n")
    assert ci.pure_pass(path) == {"tests/a": ["x.y", "x.z"], "tests/b.py": ["x.w"]}
    path.write_text("tests/a\n")
    with pytest.raises(ValueError, match="expected 'PATH: MODULE...'"):
        ci.pure_pass(path)
    path.write_text("  x.y\n")
    with pytest.raises(ValueError, match="a continuation before any path"):
        ci.pure_pass(path)


# --------------------------------------------------------------------------- rules read off the tests


def _raises_without_match(source: str) -> list[int]:
    """The lines of ``pytest.raises(...)`` that name no ``match=`` and bind no ``as NAME`` whose
    ``NAME.value`` the function reads afterwards (the error's message or fields checked there)."""
    tree = ast.parse(source)
    bad = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            continue
        read = {n.value.id for n in ast.walk(func) if isinstance(n, ast.Attribute) and n.attr == "value"
                and isinstance(n.value, ast.Name)}  # fmt: skip
        for node in ast.walk(func):
            if not isinstance(node, (ast.With, ast.AsyncWith)):
                continue
            for item in node.items:
                call = item.context_expr
                func = call.func if isinstance(call, ast.Call) else None
                if not (isinstance(func, ast.Attribute) and func.attr == "raises"
                        and isinstance(func.value, ast.Name) and func.value.id == "pytest"):  # fmt: skip
                    continue
                if any(k.arg == "match" for k in call.keywords):
                    continue
                name = item.optional_vars.id if isinstance(item.optional_vars, ast.Name) else None
                if name is None or name not in read:
                    bad.append(call.lineno)
    return sorted(set(bad))


def test_every_pytest_raises_checks_which_error_not_only_its_type():
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "corpus" in path.parts:
            continue
        found += ["%s:%d" % (path.relative_to(ROOT), line) for line in _raises_without_match(path.read_text())]
    assert not found, "pytest.raises without match= (or a check of the error's value): %s" % found


def test_the_raises_rule_catches_a_bare_type_and_accepts_a_checked_value():
    bare = "import pytest\ndef test_x():\n    with pytest.raises(ValueError):\n        f()\n"
    unread = "import pytest\ndef test_x():\n    with pytest.raises(ValueError) as exc:\n        f()\n"
    matched = "import pytest\ndef test_x():\n    with pytest.raises(ValueError, match='bad'):\n        f()\n"
    checked = ("import pytest\ndef test_x():\n    with pytest.raises(E) as exc:\n        f()\n"
               "    assert exc.value.code == 2\n")
    assert _raises_without_match(bare) == [3] and _raises_without_match(unread) == [3]
    assert _raises_without_match(matched) == [] and _raises_without_match(checked) == []


def test_a_skip_is_matched_without_the_xdist_group_its_id_carries_under_scripts_test():
    from tests.ci import _without_group

    assert _without_group("tests/spark/test_sink.py::test_x@spark") == "tests/spark/test_sink.py::test_x"
    assert _without_group("tests/a.py::test_p[a@b]") == "tests/a.py::test_p[a@b]"  # a parameter's @ stays
    assert _without_group("tests/a.py::test_p[a@b]@chaos") == "tests/a.py::test_p[a@b]"
    assert _without_group("tests/a.py::test_plain") == "tests/a.py::test_plain"
