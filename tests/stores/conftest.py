"""The ``store`` fixture: every test that takes it runs on every store.

Memory always runs. Redis, Redis Cluster (a private 3-master cluster, tests/redis_cluster.py),
SQLite, PostgreSQL and MariaDB run once their store module exists
(until then that parameter is skipped); a service that does not answer skips on a laptop and
fails in CI through the ``redis_url`` / ``postgres_url`` / ``mysql_url`` fixtures. Each test
gets a fresh key prefix or an empty pair of tables, and everything it wrote is removed
afterwards. The SQL backends share one engine per session (opening one costs more than most
tests), and hand a test's tables, emptied, to the next test of the same pytest process:
creating and dropping two tables with their indexes took a third of a SQL test's CPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from celery_sagas.stores.base import Store
from celery_sagas.stores.memory import MemoryStore

STORES = ["memory", "memory4", "redis", "redis_cluster", "sqlite", "postgres", "mysql"]


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


class TablePool:
    """Table pairs that earlier tests of this pytest process emptied, by database (a URL, or
    the backend name of a shared engine), and a store per pair made, to drop them at the end."""

    def __init__(self, drop: Callable[[Any], None] | None = None) -> None:
        self._free: dict[str, list[str]] = {}  # database -> prefixes of empty pairs
        self._made: list[Any] = []
        self._drop = drop or _drop_tables

    def borrow(self, database: str, prefix: str, open_store: Callable[[str, bool], Any]) -> Any:
        """``open_store(table_prefix, create_schema)`` on an empty table pair: one a test
        handed back, else a new one under ``prefix``."""
        free = self._free.setdefault(database, [])
        if free:
            return open_store(free.pop(), False)
        store = open_store(prefix, True)
        self._made.append(store)
        return store

    def give_back(self, database: str, store: Any) -> None:
        """Empty ``store``'s tables for the next test (TRUNCATE on PostgreSQL, where deleted
        rows stay until a vacuum); a pair that cannot be emptied is dropped instead."""
        tables = store._tables.metadata.sorted_tables
        try:
            with store.engine.begin() as conn:
                if store.engine.dialect.name == "postgresql":
                    conn.exec_driver_sql(f"TRUNCATE {', '.join(t.name for t in tables)}")
                else:
                    for table in reversed(tables):
                        conn.execute(table.delete())
        except Exception:
            self._drop(store)
            return
        self._free[database].append(store.table_prefix)

    def close(self) -> None:
        """Drop every table pair made (with the ``drop`` given, by default the store's own)."""
        for store in self._made:
            self._drop(store)


def _drop_tables(store: Any) -> None:
    store.drop_tables()
    store.close()


class SqlEngines:
    """One engine-owning SqlStore per backend for the session; tests borrow its engine and
    empty table pairs from its pool."""

    def __init__(self) -> None:
        self._owners: dict[str, Any] = {}
        self.tables = TablePool()

    def engine(self, backend: str, url: Callable[[], str]) -> Any:
        if backend not in self._owners:
            sql_store = store_class("celery_sagas.stores.sql", "SqlStore")
            self._owners[backend] = sql_store.from_url(
                url(), table_prefix="conformance_", create_schema=False
            )
        return self._owners[backend].engine

    def close(self) -> None:
        self.tables.close()
        for owner in self._owners.values():
            owner.close()


@pytest.fixture(scope="session")
def sql_tables() -> Iterator[TablePool]:
    """This process's pool of emptied SQL table pairs (for fixtures that open their own
    engine per test)."""
    pool = TablePool()
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def sql_engines() -> Iterator[SqlEngines]:
    """Session-wide SQL engines, disposed of at the end."""
    engines = SqlEngines()
    yield engines
    engines.close()


@pytest.fixture(scope="session")
def redis_clients() -> Iterator[dict[str, Any]]:
    """One client-owning RedisStore per URL for the session (a Redis Cluster client discovers
    the cluster's nodes and slots when made: a third of a cluster test's time); closed at the
    end."""
    owners: dict[str, Any] = {}
    yield owners
    for owner in owners.values():
        owner.close()


def _redis(request: pytest.FixtureRequest, prefix: str, fixture: str = "redis_url") -> Iterator[Store]:
    redis_url: str = request.getfixturevalue(fixture)
    owners: dict[str, Any] = request.getfixturevalue("redis_clients")
    redis_store = store_class("celery_sagas.stores.redis", "RedisStore")
    if redis_url not in owners:
        # The test servers run without AOF: durability is tested in test_durability.py.
        owners[redis_url] = redis_store.from_url(redis_url, require_aof=False)
    owner = owners[redis_url]
    store = redis_store(owner._client, prefix=prefix, buckets=owner.buckets, require_aof=False)
    try:
        yield store
    finally:
        client = store._client
        keys = list(client.scan_iter(match=store.layout.pattern(), count=1000))
        if keys:
            client.delete(*keys)
        store.close()


def _sql(request: pytest.FixtureRequest, backend: str, prefix: str) -> Iterator[Store]:
    engines: SqlEngines = request.getfixturevalue("sql_engines")
    if backend == "sqlite":
        path = request.getfixturevalue("tmp_path_factory").getbasetemp() / "conformance.db"
        engine = engines.engine(backend, lambda: f"sqlite:///{path}")
    else:
        engine = engines.engine(backend, lambda: request.getfixturevalue(f"{backend}_url"))
    sql_store = store_class("celery_sagas.stores.sql", "SqlStore")
    store = engines.tables.borrow(
        backend, prefix, lambda name, create: sql_store(engine, table_prefix=name,
                                                        create_schema=create))
    try:
        yield store
    finally:
        engines.tables.give_back(backend, store)
        store.close()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, unique_prefix: str) -> Iterator[Store]:
    """A fresh, empty store of each kind, cleaned up after the test."""
    backend = request.param
    if backend == "memory":
        yield MemoryStore()
    elif backend == "memory4":
        yield MemoryStore(buckets=4)
    elif backend == "redis":
        yield from _redis(request, unique_prefix)
    elif backend == "redis_cluster":
        yield from _redis(request, unique_prefix, "redis_cluster_url")
    else:
        yield from _sql(request, backend, unique_prefix + "_")
