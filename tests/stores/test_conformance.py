"""Runs the shipped store conformance suite on every built-in store."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import text

from celery_sagas.stores.base import Store
from celery_sagas.stores.memory import MemoryStore
from celery_sagas.testing.conformance import StoreConformance

GARBAGE = "not json {"


class TestBuiltinStores(StoreConformance):
    """The conformance suite over the parametrised ``store`` fixture (tests/stores/conftest)."""

    @pytest.fixture(autouse=True)
    def _bind(self, store: Store) -> None:
        self._fixture_store = store

    def make_store(self) -> Store:
        return self._fixture_store

    def destroy_store(self, store: Store) -> None:
        """The fixture drops keys and tables itself."""

    def corrupt(self, store: Store, kind: str, record_id: str) -> None:
        if isinstance(store, MemoryStore):
            with store._lock:
                key = (kind, record_id)
                store._records[key] = replace(store._records[key], body=GARBAGE)
        elif type(store).__name__ == "RedisStore":
            store._client.hset(store.layout.record(kind, record_id), "body", GARBAGE)
        elif type(store).__name__ == "SqlStore":
            table = f"{store.table_prefix}envelopes"
            statement = text(f"UPDATE {table} SET body = :body WHERE kind = :kind AND id = :id")
            with store.engine.begin() as connection:
                connection.execute(statement, {"body": GARBAGE, "kind": kind, "id": record_id})
        else:
            pytest.skip(f"no corrupt() hook for {type(store).__name__}")
