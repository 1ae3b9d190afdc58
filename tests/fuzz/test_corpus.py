"""Every committed input, seeds (``corpus/``) and past failures (``crashes/``), run through
its target: the crashes are the regression tests of the bugs the fuzzer found. Needs no
atheris."""

from __future__ import annotations

import pytest

from . import CORPUS, CRASHES, TARGETS, target_module


def _inputs():
    for target in sorted(TARGETS):
        for kind, root in (("corpus", CORPUS), ("crashes", CRASHES)):
            folder = root / target
            for path in sorted(folder.iterdir()) if folder.is_dir() else ():
                if path.is_file() and not path.name.startswith("."):
                    yield pytest.param(target, path, id=f"{target}/{kind}/{path.name}")


INPUTS = list(_inputs())


@pytest.mark.parametrize("target,path", INPUTS)
def test_committed_input(target, path):
    target_module(target).TestOneInput(path.read_bytes())


def test_every_target_has_seeds():
    for target in TARGETS:
        assert len([p for p in (CORPUS / target).iterdir() if p.is_file()]) >= 3, target
