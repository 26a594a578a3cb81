"""The async client on every store's asyncio driver: the same records, writes and errors as
the synchronous client (docs/async.md). No worker: the step messages go to an in-memory broker
and nobody consumes them, so every state seen here is one the clients wrote."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_sagas import Sagas
from celery_sagas.errors import SagaConfigurationError, SagaNotFound, SagaValidationError
from celery_sagas.stores.memory import MemoryStore


def _sagas(store: Any, **options: Any) -> Sagas:
    app = Celery(f"aio-{uuid.uuid4().hex[:6]}", broker="memory://localhost/")
    sagas = Sagas(app, store=store, **options)

    @sagas.step(compensate=None, name="aio.reserve")
    def reserve(sku: str) -> dict[str, str]:
        return {"reservation": sku}

    @sagas.saga("aio-order")
    def order(ctx: Any, data: dict[str, Any]) -> None:
        ctx.step(reserve, data["sku"])

    return sagas


def _scenario(sagas: Sagas) -> None:
    aio = sagas.aio
    saga_id = f"aio-{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        try:
            handle = await aio.start("aio-order", {"sku": "A"}, saga_id=saga_id)
            assert handle.record.state == "running"
            [step] = (await aio.get(saga_id)).steps
            assert (step.state, step.attempts) == ("executing", 0)
            with pytest.raises(SagaValidationError):
                await aio.signal(saga_id, "bad name", None)
            with pytest.raises(SagaNotFound):
                await aio.signal("nobody", "go", None)
            await aio.cancel(saga_id)  # the unclaimed step is abandoned: nothing to undo
            record = await aio.wait(saga_id, timeout=10)
            assert record.state == "compensated"
        finally:
            await aio.aclose()

    asyncio.run(run())
    assert sagas.get(saga_id).state == "compensated"  # the sync client reads the same record


@pytest.mark.redis
def test_redis(redis_url: str) -> None:
    # the test Redis runs without AOF (the check is tested in test_durability.py)
    sagas = _sagas(redis_url, key_prefix=f"aio{uuid.uuid4().hex[:6]}", require_aof=False)
    _scenario(sagas)


@pytest.mark.postgres
def test_postgresql(postgres_url: str) -> None:
    sagas = _sagas(postgres_url, table_prefix=f"aio{uuid.uuid4().hex[:6]}_")
    try:
        _scenario(sagas)
    finally:
        sagas.store.drop_tables()  # type: ignore[attr-defined]


@pytest.mark.mysql
def test_mysql(mysql_url: str) -> None:
    sagas = _sagas(mysql_url, table_prefix=f"aio{uuid.uuid4().hex[:6]}_")
    try:
        _scenario(sagas)
    finally:
        sagas.store.drop_tables()  # type: ignore[attr-defined]


def test_sqlite_file(tmp_path: Path) -> None:
    _scenario(_sagas(f"sqlite:///{tmp_path / 'sagas.db'}"))


def test_a_memory_store_object_is_shared() -> None:
    _scenario(_sagas(MemoryStore(), allow_non_durable=True))


def test_a_store_object_that_does_io_is_refused_clearly(tmp_path: Path) -> None:
    from celery_sagas.stores.sql.store import SqlStore

    sagas = _sagas(SqlStore.from_url(f"sqlite:///{tmp_path / 'x.db'}"))

    async def run() -> None:
        with pytest.raises(SagaConfigurationError, match="needs the store as a URL"):
            await sagas.aio.get("x")

    asyncio.run(run())


def _run_then_drop(sagas: Sagas, run: Callable[[], Awaitable[None]]) -> None:
    """Run ``run`` in a new event loop, close its async client, then drop the SQL tables."""

    async def closing() -> None:
        try:
            await run()
        finally:
            await sagas.aio.aclose()

    try:
        asyncio.run(closing())
    finally:
        sagas.store.drop_tables()  # type: ignore[attr-defined]


@pytest.mark.postgres
def test_calls_past_the_stores_connections_wait_before_they_begin(
        postgres_url: str, monkeypatch: Any) -> None:
    """The PostgreSQL engine holds 15 connections (5 + 10 overflow): of 40 concurrent starts,
    at most 15 run at once, the others waiting before their replay, not at the pool."""
    sagas = _sagas(postgres_url, table_prefix=f"aio{uuid.uuid4().hex[:6]}_")
    inside: list[int] = []
    original = Sagas.start

    def counting(self: Sagas, definition: str, input: Any, saga_id: str | None = None) -> Any:
        inside.append(1)
        try:
            return original(self, definition, input, saga_id=saga_id)
        finally:
            inside.pop()

    monkeypatch.setattr(Sagas, "start", counting)
    peak = 0

    async def run() -> None:
        nonlocal peak
        starts = [asyncio.ensure_future(sagas.aio.start("aio-order", {"sku": "A"}, saga_id=f"g{n}"))
                  for n in range(40)]
        while not all(s.done() for s in starts):
            peak = max(peak, len(inside))
            await asyncio.sleep(0)
        assert {s.result().record.state for s in starts} == {"running"}

    _run_then_drop(sagas, run)
    assert 1 <= peak <= 15


@pytest.mark.postgres
def test_the_pools_overflow_stays_open_between_waves(postgres_url: str, monkeypatch: Any) -> None:
    """120 concurrent starts run in waves of 15: the engine opens its 15 connections once,
    not an overflow connection per call past the first 5 (closed on return, reopened at once)."""
    import psycopg

    sagas = _sagas(postgres_url, table_prefix=f"aio{uuid.uuid4().hex[:6]}_")
    opened: list[int] = []
    connect = psycopg.AsyncConnection.connect.__func__  # type: ignore[attr-defined]

    async def counting(cls: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(1)
        return await connect(cls, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(counting))

    async def run() -> None:
        await asyncio.gather(*(sagas.aio.start("aio-order", {"sku": "A"}, saga_id=f"w{n}")
                               for n in range(120)))

    _run_then_drop(sagas, run)
    assert 1 <= len(opened) <= 16  # the pool's 15, and the LISTEN connection of wait's notices
