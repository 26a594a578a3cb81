"""Fixtures of the reliability suite: a private redis-server binary and service URLs."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import REQUIRE


@pytest.fixture(scope="session")
def redis_server() -> str:
    """Path of the redis-server binary the scenarios start privately (skip or fail without)."""
    found = shutil.which("redis-server")
    if found is None:
        message = "redis-server is not on the PATH"
        if REQUIRE:
            pytest.fail(f"{message} (CELERY_SAGAS_REQUIRE_SERVICES=1)", pytrace=False)
        pytest.skip(message)
    return found
