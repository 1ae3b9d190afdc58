"""Run one target under libFuzzer: ``python -m tests.fuzz._run TARGET [libFuzzer flags] [DIRS]``.

The target's module and the code it drives (``disque_py``, ``cluster_bus``) are imported
with atheris' coverage instrumentation on, then libFuzzer takes over the process (it exits
with 0 at the end of a clean run, non-zero after a failing input, which it saves under
``-artifact_prefix``). ``python -m tests.fuzz`` and ``scripts/fuzz`` call this; so do the
bounded runs of the test suite.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    import atheris

    from tests.fuzz import TARGETS

    if len(argv) < 2 or argv[1] not in TARGETS:
        sys.exit(f"usage: python -m tests.fuzz._run {{{','.join(TARGETS)}}} [libFuzzer flags] [corpus dirs]")
    name = argv[1]
    with atheris.instrument_imports(include=["disque_py", "cluster_bus", "tests.fuzz"]):
        from tests.fuzz import target_module

        module = target_module(name)
    atheris.Setup([argv[0]] + argv[2:], module.TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
