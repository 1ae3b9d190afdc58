"""The release: one version, said alike by the package's metadata and the code, and newer than
the release of before announcements (docs/OPERATIONS.md, "Releases")."""

from __future__ import annotations

import tomllib
from pathlib import Path

from cluster_bus.membership import valid_release
from disque_py import __version__
from disque_py.core.features import UNANNOUNCED_RELEASE, release_key

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_and_the_package_say_the_same_release():
    with open(ROOT / "pyproject.toml", "rb") as f:
        assert tomllib.load(f)["project"]["version"] == __version__


def test_the_release_is_announceable_and_later_than_the_first():
    assert valid_release(__version__)
    assert release_key(__version__) > release_key(UNANNOUNCED_RELEASE)
