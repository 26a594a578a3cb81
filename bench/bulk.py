"""Bulk loading for the benchmarks: records written straight in a store's own layout.

Creating 100,000 or 1,000,000 records through the store's scripts one by one would take longer
than the measurements; these writers do what the create script and statement do (the record,
its state index and its label index) in pipelines on Redis and with ``COPY`` on PostgreSQL.
"""

from __future__ import annotations

import argparse
import itertools
import time
import uuid
from collections.abc import Callable, Iterator

from celery_sagas.stores.base import Envelope
from celery_sagas.stores.redis import RedisStore
from celery_sagas.stores.sql import SqlStore
from celery_sagas.stores.sql._schema import build_tables

BATCH = 10_000


def add_store_arguments(parser: argparse.ArgumentParser, stores: str = "redis,postgres") -> None:
    """``--redis``, ``--postgres`` (store URLs) and ``--stores`` (which of them to run)."""
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15", help="Redis store URL")
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
                        help="PostgreSQL store URL (SQLAlchemy)")
    parser.add_argument("--stores", default=stores, help="comma-separated: redis, postgres")


def open_store(backend: str, url: str, stem: str = "bench") -> RedisStore | SqlStore:
    """A store under a fresh prefix (``<stem><hex>``)."""
    prefix = stem + uuid.uuid4().hex[:8]
    if backend == "redis":
        return RedisStore.from_url(url, prefix=prefix, require_aof=False)  # bench Redis: no AOF
    return SqlStore.from_url(url, table_prefix=prefix + "_")


def _redis_writer(store: RedisStore) -> Callable[[list[Envelope]], None]:
    """HSET each record and ZADD it to its state and label indexes and its bucket's id and
    creation indexes, as the create script does (created at its last write: never rewritten)."""
    layout, client = store.layout, store._client

    def write(batch: list[Envelope]) -> None:
        pipe = client.pipeline(transaction=False)
        for e in batch:
            assert e.label is not None
            pipe.hset(layout.record(e.kind, e.id), mapping={
                "id": e.id, "version": e.version, "state": e.state,
                "updated_at_ms": e.updated_at_ms, "body": e.body, "label": e.label})
            for label in (None, e.label):
                pipe.zadd(layout.record_index(e.kind, e.id, e.state, label), {e.id: e.updated_at_ms})
            pipe.zadd(layout.ids(e.kind, store.bucket_of(e.id)), {e.id: 0})
            pipe.zadd(layout.created(e.kind, store.bucket_of(e.id)), {e.id: e.updated_at_ms})
        pipe.execute()

    return write


def _postgres_writer(store: SqlStore) -> Callable[[list[Envelope]], None]:
    """COPY into the envelope table (created at its last write, as the store inserts it)."""
    table = build_tables(store.table_prefix).envelopes
    columns = ("kind", "id", "version", "state", "updated_at_ms", "body", "label")
    statement = f"COPY {table.name} ({', '.join(columns)}, created_at_ms) FROM STDIN"

    def copy(batch: list[Envelope]) -> None:
        raw = store.engine.raw_connection()
        try:
            with raw.cursor() as cursor, cursor.copy(statement) as copy_in:  # type: ignore[attr-defined]
                for e in batch:
                    copy_in.write_row((*(getattr(e, c) for c in columns), e.updated_at_ms))
            raw.commit()
        finally:
            raw.close()

    return copy


def load(store: RedisStore | SqlStore, items: Iterator[Envelope], total: int) -> float:
    """Write the envelopes in the store's own layout, fast; seconds taken."""
    if isinstance(store, RedisStore):
        write = _redis_writer(store)
    elif store.engine.dialect.name == "postgresql":
        write = _postgres_writer(store)
    else:
        raise SystemExit("the loader writes Redis and PostgreSQL only")
    started, done = time.perf_counter(), 0
    while batch := list(itertools.islice(items, BATCH)):
        write(batch)
        done += len(batch)
        if done % 50_000 < BATCH or done == total:
            print(f"  loaded {done:,}/{total:,} ({time.perf_counter() - started:.1f} s)", flush=True)
    if isinstance(store, SqlStore):  # fresh planner statistics after a bulk load
        table = build_tables(store.table_prefix).envelopes.name
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f"VACUUM (ANALYZE) {table}")
    return time.perf_counter() - started


def destroy(store: RedisStore | SqlStore) -> None:
    """Remove everything the store holds under its prefix, and close it."""
    if isinstance(store, SqlStore):
        store.drop_schema()
    else:
        client = store._client
        keys = list(client.scan_iter(match=store.layout.pattern(), count=10_000))
        for start in range(0, len(keys), BATCH):
            client.unlink(*keys[start:start + BATCH])
    store.close()
