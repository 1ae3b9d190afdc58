"""Every section that code, docs or scripts cite exists where they say.

A citation is written ``(FILE, "Section")``, ``FILE, section "Section"`` or ``FILE ("Section")``: FILE a Markdown file
of the repository (``BENCHMARKS.md``, ``docs/ARCHITECTURE.md`` ...), Section the start of one of
its headings (``## The house rebuilt: ...`` is cited as ``"The house rebuilt"``), compared without
case. A section that moves (BENCHMARKS.md became a dashboard, its sections went to
docs/benchmarks-history.md) takes its citations with it, or this test names each one left behind.
A Markdown file a text names by its path exists too.

docs/benchmarks-history.md is left out (and this file, whose examples cite what is not there): the
history is a record of past measurements, kept as they
were written (its citations name the pages of their day).
"""

from __future__ import annotations

import re
import sys
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: a citation: the file, then the quoted start of a heading
CITATION = re.compile(r'\b((?:[\w.-]+/)*[\w.-]+\.md)\)?(?:,\s+(?:section\s+)?|\s+\()"([^"\n]+)"')
#: a Markdown file named by its path (docs/X.md, tests/.../X.md, README.md ...)
MD_PATH = re.compile(r"(?<![\w./-])((?:docs|tests|scripts|examples)/(?:[\w.-]+/)*[\w.-]+\.md|[A-Z][A-Z_]+\.md)\b")
TEXT_SUFFIXES = {".py", ".md", ".js", ".html", ".toml", ".example", ".sh", ".tcl", ".cfg", ".ini", ""}
LEFT_OUT = {"docs/benchmarks-history.md", "tests/docs/test_citations.py"}  # the history; this file's own examples


def tracked_texts() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    out = []
    for name in names:
        path = ROOT / name
        if name in LEFT_OUT or path.suffix not in TEXT_SUFFIXES or not path.is_file():
            continue
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        out.append(path)
    return out


def headings(path: Path) -> list[str]:
    """The headings of a Markdown file, '#' marks and surrounding space stripped, fenced code left out."""
    found, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.append(line.lstrip("#").strip())
    return found


def resolve(name: str, citing: Path) -> Path | None:
    """The file a citation names: from the repository's root, its docs/, or beside the citing file."""
    for base in (ROOT, ROOT / "docs", citing.parent):
        candidate = base / name
        if candidate.is_file():
            return candidate
    return None


def broken_citations(files: list[Path]) -> list[str]:
    out = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        for m in CITATION.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            name, section = m.group(1), m.group(2)
            target = resolve(name, path)
            if target is None:
                out.append(f"{where}:{line}: cites {name}, which does not exist")
            elif not any(h.lower().startswith(section.lower()) for h in headings(target)):
                out.append(f'{where}:{line}: cites {name}, "{section}": no such section')
        for m in MD_PATH.finditer(text):
            if resolve(m.group(1), path) is None:
                line = text.count("\n", 0, m.start()) + 1
                out.append(f"{where}:{line}: names {m.group(1)}, which does not exist")
    return sorted(set(out))


def test_every_cited_section_exists():
    files = tracked_texts()
    assert len(files) > 100 and any(p.name == "gcpolicy.py" for p in files)
    assert broken_citations(files) == []


def test_the_check_finds_a_moved_section_and_a_missing_file(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "history.md").write_text("# History\n\n## Garbage collector: freeze (2026)\n")
    (tmp_path / "BENCH.md").write_text("# Bench\n\n```\n## Garbage collector in a code block\n```\n")
    code = tmp_path / "gc.py"
    code.write_text(
        '# (docs/history.md, "Garbage collector") is right\n'
        '# (BENCH.md, "Garbage collector") moved away\n'
        '# docs/history.md, section "garbage COLLECTOR" matches without case\n'
        '# (docs/gone.md, "Anything") and docs/missing.md are not there\n'
    )
    assert broken_citations([code]) == [
        'gc.py:2: cites BENCH.md, "Garbage collector": no such section',
        "gc.py:4: cites docs/gone.md, which does not exist",
        "gc.py:4: names docs/gone.md, which does not exist",
        "gc.py:4: names docs/missing.md, which does not exist",
    ]


@pytest.mark.parametrize("text", ['see (README.md, "Installing")', 'docs/ARCHITECTURE.md, section "The compiled build"',
                                  'as docs/ARCHITECTURE.md ("The rooms") says'])
def test_real_citations_read_as_citations(text):
    m = CITATION.search(text)
    assert m is not None
    assert resolve(m.group(1), ROOT / "x.py") is not None
    assert any(h.startswith(m.group(2)) for h in headings(resolve(m.group(1), ROOT / "x.py")))
