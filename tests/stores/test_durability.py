"""A store whose server may lose what it acknowledged: a Redis without AOF is refused at first
use unless the user opts out (then one WARNING per process), a SQL server that acknowledges
commits it may lose is warned about once (docs/guarantees.md#durability).

Redis servers are private (``--appendonly no`` / ``yes``) on ports of
``CELERY_SAGAS_TEST_PORTS``, started with the reliability suite's ``PrivateRedis``.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import create_engine, event

from celery_sagas import Sagas, open_store
from celery_sagas.errors import NonDurableStoreError, StoreError
from celery_sagas.stores._durability import _warned
from celery_sagas.stores.base import Envelope
from celery_sagas.stores.redis import RedisStore
from celery_sagas.stores.sql import SqlStore
from celery_sagas.stores.sql._durability import _read
from tests.conftest import REQUIRE
from tests.reliability.cluster import PrivateRedis

T0 = 1_700_000_000_000
FIX = ("appendonly yes", "appendfsync everysec", "appendfsync always", "power loss",
       "?require_aof=false", "sagas_require_aof = False")


def envelope(record_id: str = "order-1") -> Envelope:
    return Envelope("saga", record_id, 1, "running", T0, f'{{"id":"{record_id}"}}')


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith("celery_sagas")]


@pytest.fixture(autouse=True)
def fresh_process() -> Iterator[None]:
    """Forget the warnings given: private servers reuse ports, and each test is a new process
    as far as "once per process" goes."""
    _warned.clear()
    yield
    _warned.clear()


@pytest.fixture
def no_aof(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A private ``redis-server --appendonly no`` (the server's default)."""
    need_redis_server()
    server = PrivateRedis(tmp_path / "no-aof", appendfsync=None).start()
    yield server
    server.close()


@pytest.fixture
def with_aof(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A private ``redis-server --appendonly yes --appendfsync everysec``."""
    need_redis_server()
    server = PrivateRedis(tmp_path / "aof").start()
    yield server
    server.close()


def need_redis_server() -> None:
    """Skip (laptop) or fail (CI) without a redis-server binary."""
    if shutil.which("redis-server") is None:
        if REQUIRE:
            pytest.fail("redis-server is not on the PATH", pytrace=False)
        pytest.skip("redis-server is not on the PATH")


def keys_of(server: PrivateRedis) -> list[bytes]:
    client = redis.Redis.from_url(f"{server.url}/0")
    try:
        return list(client.keys("*"))
    finally:
        client.close()


# ---------------------------------------------------------------------- Redis


@pytest.mark.redis
def test_a_redis_without_aof_is_refused_at_first_use_with_the_fix_named(
    no_aof: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    # given: a store on a server without an append-only file (opening connects to nothing)
    store = RedisStore.from_url(f"{no_aof.url}/0", prefix="refused")
    # when: it is first used
    with pytest.raises(NonDurableStoreError) as refused:
        store.create(envelope())
    # then: refused with what to do, a StoreError like every store failure, nothing written
    message = str(refused.value)
    assert f"127.0.0.1:{no_aof.port}" in message and "aof_enabled:0" in message
    for words in FIX:
        assert words in message
    assert isinstance(refused.value, StoreError)
    assert keys_of(no_aof) == []
    # and: every later use is refused too, each without a warning
    with pytest.raises(NonDurableStoreError):
        store.get("saga", "order-1")
    assert warnings_of(caplog) == []
    assert store.durable is True  # it never acknowledges a write on that server
    store.close()


@pytest.mark.redis
def test_the_url_opt_out_accepts_a_redis_without_aof_with_one_warning_per_process(
    no_aof: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    # given: two stores opened with ?require_aof=false on a server without AOF
    first = open_store(f"{no_aof.url}/0?require_aof=false", key_prefix="accepted")
    second = RedisStore.from_url(f"{no_aof.url}/0", prefix="accepted", require_aof=False)
    # when: both are used, again and again
    assert first.create(envelope("a")) is True
    assert first.get("saga", "a") is not None
    assert second.create(envelope("b")) is True
    # then: exactly one WARNING, naming the risk and the fix, and the stores say the truth
    [warning] = warnings_of(caplog)
    assert f"127.0.0.1:{no_aof.port}" in warning and "require_aof=false" in warning
    assert "appendonly yes" in warning and "steps may run twice" in warning
    assert first.durable is False and second.durable is False
    first.close()
    second.close()


@pytest.mark.redis
def test_a_redis_with_aof_is_accepted_without_a_warning(
    with_aof: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore.from_url(f"{with_aof.url}/0", prefix="durable")
    assert store.create(envelope()) is True
    assert store.get("saga", "order-1") == envelope()
    assert warnings_of(caplog) == []
    assert store.durable is True
    store.close()


@pytest.mark.redis
def test_turning_aof_on_lifts_the_refusal_without_a_restart(no_aof: PrivateRedis) -> None:
    store = RedisStore.from_url(f"{no_aof.url}/0", prefix="turned-on")
    with pytest.raises(NonDurableStoreError):
        store.create(envelope())
    client = redis.Redis.from_url(f"{no_aof.url}/0")
    client.config_set("appendonly", "yes")
    deadline = time.monotonic() + 30
    while client.info("persistence")["aof_enabled"] != 1:
        assert time.monotonic() < deadline, "appendonly yes never took effect"
        time.sleep(0.05)
    client.close()
    assert store.create(envelope()) is True
    assert store.durable is True
    store.close()


@pytest.mark.redis
def test_a_redis_whose_persistence_cannot_be_read_is_used_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # given: a managed-service-like server where INFO is disabled
    need_redis_server()
    server = PrivateRedis(tmp_path / "no-info", appendfsync=None,
                          extra=("--rename-command", "INFO", "")).start()
    try:
        store = RedisStore.from_url(f"{server.url}/0", prefix="unknown")
        second = RedisStore.from_url(f"{server.url}/0", prefix="unknown")
        # when: both are used
        assert store.create(envelope("a")) is True
        assert second.create(envelope("b")) is True
        # then: used, with one warning saying what could not be checked
        [warning] = warnings_of(caplog)
        assert "cannot read the persistence" in warning and "appendonly yes" in warning
        store.close()
        second.close()
    finally:
        server.close()


@pytest.mark.redis
def test_the_sagas_setting_opts_out_as_the_url_option_does(
    no_aof: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery("durability", set_as_current=False, broker="memory://")
    refused = Sagas(app, store=f"{no_aof.url}/0", key_prefix="setting")
    with pytest.raises(NonDurableStoreError):
        refused.get("order-1")
    app.conf.sagas_require_aof = False
    accepted = Sagas(app, store=f"{no_aof.url}/0", key_prefix="setting")
    assert accepted.get("order-1") is None
    assert len(warnings_of(caplog)) == 1
    assert accepted.store.durable is False


@pytest.mark.redis
def test_every_master_of_a_cluster_is_checked(redis_cluster_url: str) -> None:
    # the test cluster's nodes run without AOF (tests/redis_cluster.py)
    store: Any = open_store(redis_cluster_url, key_prefix="cluster-durability")
    names = {node.name for node in store._client.get_primaries()}
    with pytest.raises(NonDurableStoreError) as refused:
        store.get("saga", "order-1")
    assert len(names) == 3 and all(name in str(refused.value) for name in names)
    store.close()


def test_a_bad_require_aof_in_the_url_is_refused_before_anything_opens() -> None:
    with pytest.raises(StoreError, match="require_aof= must be true or false"):
        open_store("redis://127.0.0.1:1/0?require_aof=perhaps")


# ---------------------------------------------------------------------- SQL


def test_sqlite_with_synchronous_off_is_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'off.db'}")

    @event.listens_for(engine, "connect")
    def synchronous_off(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA synchronous = OFF")

    first = SqlStore(engine, table_prefix="a_")
    second = SqlStore(engine, table_prefix="b_")
    assert first.create(envelope()) is True and second.create(envelope()) is True
    [warning] = warnings_of(caplog)
    assert "PRAGMA synchronous = OFF" in warning and "NORMAL" in warning
    assert first.durable is False and second.durable is False
    engine.dispose()


def test_sqlite_with_its_default_synchronous_is_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqlStore.from_url(f"sqlite:///{tmp_path / 'full.db'}")
    assert store.create(envelope()) is True
    assert warnings_of(caplog) == [] and store.durable is True
    store.close()


@pytest.mark.postgres
def test_postgres_with_synchronous_commit_off_is_warned_about_once(
    postgres_url: str, unique_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # synchronous_commit set for the store's sessions only (as a role or database setting does)
    store = SqlStore.from_url(postgres_url, table_prefix=unique_prefix + "_",
                              connect_args={"options": "-c synchronous_commit=off"})
    try:
        assert store.create(envelope()) is True
        [warning] = warnings_of(caplog)
        assert "synchronous_commit = off" in warning and "***" not in warning.split("@")[0][-4:]
        assert store.durable is False
    finally:
        store.drop_schema()
        store.close()


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres),
                                     pytest.param("mysql", marks=pytest.mark.mysql)])
def test_a_sql_server_with_its_defaults_is_not_warned_about(
    backend: str, request: pytest.FixtureRequest, unique_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = SqlStore.from_url(request.getfixturevalue(f"{backend}_url"),
                              table_prefix=unique_prefix + "_")
    try:
        assert store.create(envelope()) is True
        assert warnings_of(caplog) == [] and store.durable is True
    finally:
        store.drop_schema()
        store.close()


class _Connection:
    """A DBAPI connection answering one value (innodb_flush_log_at_trx_commit is global: no
    test may change it on a shared server)."""

    def __init__(self, value: object) -> None:
        self.value = value

    def cursor(self) -> _Connection:
        return self

    def execute(self, statement: str) -> None:
        assert statement == "SELECT @@innodb_flush_log_at_trx_commit"

    def fetchone(self) -> tuple[object]:
        return (self.value,)

    def close(self) -> None:
        pass

    def rollback(self) -> None:
        pass


@pytest.mark.parametrize(("value", "says"), [(1, None), (2, "power loss"), (0, "even a crash")])
def test_mysql_flushing_the_log_less_than_at_every_commit_is_a_problem(
    value: int, says: str | None
) -> None:
    found = _read("mysql", _Connection(value))
    assert found == [] if says is None else (len(found) == 1 and says in found[0])
