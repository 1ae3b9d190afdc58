"""Coverage-guided fuzzing (atheris) and property tests (hypothesis) of the parsers that
read untrusted bytes: client requests (RESP), the commands a node runs, the cluster
bus (frames, messages, the authenticated handshake) and the append-only file.

Each target is one module, ``fuzz_<target>.py``, whose ``TestOneInput(data)`` raises only
when the code under test misbehaves (an undocumented exception, a broken invariant, two
ways of feeding the same bytes that disagree). The same function serves libFuzzer (through
atheris: ``python -m tests.fuzz``, ``scripts/fuzz``), the bounded runs in the test suite
(``test_fuzz_bounded.py``) and the replay of the committed inputs (``test_corpus.py``):
``corpus/<target>/`` holds hand-made seeds, ``crashes/<target>/`` every input that once
failed (a regression test each). The hypothesis properties are the ``test_*_props.py``.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
CRASHES = HERE / "crashes"
DICTS = HERE / "dicts"
WORK = HERE / "work"  # the fuzzer's own growing corpus (not committed: see .gitignore)

#: target name -> its module (under tests.fuzz)
TARGETS = {
    "resp": "fuzz_resp",
    "commands": "fuzz_commands",
    "bus": "fuzz_bus",
    "aof": "fuzz_aof",
}


def target_module(name: str):
    import importlib

    return importlib.import_module(f"tests.fuzz.{TARGETS[name]}")
