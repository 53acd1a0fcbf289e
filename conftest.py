"""Doctests of the package (``--doctest-modules``) run against a private redis-server.

A docstring example that needs a lock store uses ``redis_url``: the URL of the test
session's own server (never the machine's shared Redis), emptied for each example.

And ``-s`` or ``--pdb`` runs the suite in one process (see :func:`pytest_cmdline_main`).
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _doctest_redis(request: pytest.FixtureRequest) -> Any:
    if isinstance(request.node, pytest.DoctestItem):
        namespace = request.getfixturevalue("doctest_namespace")
        namespace["redis_url"] = request.getfixturevalue("redislock_url")
    yield


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``-s`` (see what the tests print) or ``--pdb`` runs the tests in this one process.

    The suite runs in several processes (pyproject.toml's ``-n 3``, pytest-xdist), whose
    output pytest does not show and which cannot stop in a debugger; ``pytest -s``, as in
    the docs' commands for the soak and the fault summaries, would print nothing. Called
    before pytest-xdist reads ``-n`` (this hook of a conftest comes before a plugin's).
    """
    if config.option.capture == "no" or config.getoption("usepdb", False):
        config.option.numprocesses = 0
        config.option.dist = "no"
