"""Doctests of the package (``--doctest-modules``) run against a private redis-server.

A docstring example that needs a lock store uses ``redis_url``: the URL of the test
session's own server (never the machine's shared Redis), emptied for each example.
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
