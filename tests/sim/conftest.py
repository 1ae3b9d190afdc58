"""Sim tests: the ``replication`` marker and replay hints for failed runs."""

from __future__ import annotations

import pytest

from .cluster_model import created_clusters, reset_created


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "replication: needs cross-node job replication in the core (deselect with -m 'not replication')",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    reset_created()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        clusters = created_clusters()
        if clusters:
            lines = ["%r: %s" % (c, c.describe()) for c in clusters]
            report.sections.append(("simulated clusters (deterministic: replay with the command shown)", "\n".join(lines)))
