"""The ``store`` fixture: every test that takes it runs on all five stores.

Memory always runs. Redis, SQLite, PostgreSQL and MariaDB run once their store module exists
(until then that parameter is skipped); a service that does not answer skips on a laptop and
fails in CI through the ``redis_url`` / ``postgres_url`` / ``mysql_url`` fixtures. Each test
gets a fresh key prefix or table prefix, and everything it wrote is removed afterwards.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_sagas.stores.base import Store
from celery_sagas.stores.memory import MemoryStore

STORES = ["memory", "redis", "sqlite", "postgres", "mysql"]


def store_class(module: str, name: str) -> Any:
    """The store class, or a skip while its module has not been written yet."""
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise  # the module exists but a dependency is missing: that is a failure
        pytest.skip(f"{module} does not exist yet")
    if not hasattr(found, name):
        pytest.skip(f"{module}.{name} does not exist yet")
    return getattr(found, name)


def _redis(request: pytest.FixtureRequest, prefix: str) -> Iterator[Store]:
    redis_url: str = request.getfixturevalue("redis_url")
    store = store_class("celery_sagas.stores.redis", "RedisStore").from_url(redis_url, prefix=prefix)
    try:
        yield store
    finally:
        client = store._client
        keys = list(client.scan_iter(match=store.layout.pattern(), count=1000))
        if keys:
            client.delete(*keys)
        store.close()


def _sql(url: str, prefix: str) -> Iterator[Store]:
    store = store_class("celery_sagas.stores.sql", "SqlStore").from_url(url, table_prefix=prefix)
    try:
        yield store
    finally:
        store.drop_tables()
        store.close()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, unique_prefix: str, tmp_path: Path) -> Iterator[Store]:
    """A fresh, empty store of each kind, cleaned up after the test."""
    kind = request.param
    if kind == "memory":
        yield MemoryStore()
    elif kind == "redis":
        yield from _redis(request, unique_prefix)
    elif kind == "sqlite":
        yield from _sql(f"sqlite:///{tmp_path / 'sagas.db'}", unique_prefix + "_")
    elif kind == "postgres":
        yield from _sql(request.getfixturevalue("postgres_url"), unique_prefix + "_")
    else:
        yield from _sql(request.getfixturevalue("mysql_url"), unique_prefix + "_")
