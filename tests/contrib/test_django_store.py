"""The saga store on a Django database (docs/django.md): URLs from Django's settings, tables
from the migration, and the store contract over those tables on PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from sqlalchemy import inspect, text

from celery_sagas.contrib.django import database_store, database_url
from celery_sagas.contrib.django._schema import create_tables, drop_tables
from celery_sagas.errors import SagaConfigurationError
from celery_sagas.stores.base import Store
from celery_sagas.stores.sql import SqlStore
from celery_sagas.testing.conformance import StoreConformance
from tests.contrib.conftest import TABLE_PREFIX
from tests.stores.conftest import TablePool

GARBAGE = "not json {"


def test_the_url_names_the_database_django_connects_to_with_the_client_options() -> None:
    # given
    databases = {"pgopts": {"ENGINE": "django.db.backends.postgresql", "NAME": "shop",
                            "USER": "app", "PASSWORD": "p@ss:word/1", "HOST": "db.local",
                            "PORT": "6432", "OPTIONS": {"sslmode": "require", "pool": True,
                                                         "isolation_level": 1}},
                 "socket": {"ENGINE": "django.db.backends.postgresql", "NAME": "shop",
                            "HOST": "/var/run/postgresql"}}

    connections.settings.update(databases)

    # when
    try:
        tcp, socket = database_url("pgopts"), database_url("socket")
    finally:
        for alias in databases:
            connections.settings.pop(alias)

    # then
    assert tcp == "postgresql+psycopg://app:p%40ss%3Aword%2F1@db.local:6432/shop?sslmode=require"
    assert socket == "postgresql+psycopg:///shop?host=%2Fvar%2Frun%2Fpostgresql"


def test_an_unknown_alias_or_a_database_in_one_process_memory_is_refused() -> None:
    # given
    memory = {"mem": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    connections.settings.update(memory)

    # when / then
    try:
        with pytest.raises(SagaConfigurationError, match="no Django database 'nope'"):
            database_url("nope")
        with pytest.raises(SagaConfigurationError, match="one process's memory"):
            database_url("mem")
    finally:
        connections.settings.pop("mem")


def test_migrate_creates_the_tables_the_store_uses_and_zero_drops_them() -> None:
    # given: the saga store on the database "other"
    prefix = "m" + uuid.uuid4().hex[:8] + "_"
    with override_settings(SAGAS={"store": "django://other", "table_prefix": prefix}):
        with pytest.raises(SagaConfigurationError, match=r"manage\.py migrate"):
            database_store("other")

        # when
        call_command("migrate", "celery_sagas", database="other", verbosity=0)
        store = database_store("other")
        try:
            made = set(inspect(store.engine).get_table_names())
            indexes = {i["name"] for i in inspect(store.engine).get_indexes(f"{prefix}envelopes")}
            call_command("migrate", "celery_sagas", "zero", database="other", verbosity=0)
            left = set(inspect(store.engine).get_table_names())
        finally:
            store.close()

    # then
    assert {f"{prefix}envelopes", f"{prefix}leases"} <= made
    assert {f"ix_{prefix}envelopes_scan", f"ix_{prefix}envelopes_label",
            f"ix_{prefix}envelopes_due"} <= indexes
    assert not {f"{prefix}envelopes", f"{prefix}leases"} & left


def test_the_migration_leaves_databases_other_than_the_store_s_alone(migrated: None) -> None:
    # given: the store is on "default", which migrated; "other" migrates now
    call_command("migrate", "celery_sagas", database="other", verbosity=0)

    # then
    with connections["other"].cursor():
        tables = set(connections["other"].introspection.table_names())
    assert f"{TABLE_PREFIX}envelopes" not in tables
    assert f"{TABLE_PREFIX}envelopes" in set(connections["default"].introspection.table_names())
    call_command("migrate", "celery_sagas", "zero", database="other", verbosity=0)


@pytest.fixture(scope="module")
def migrated_pairs() -> Iterator[TablePool]:
    """Saga table pairs made on ``pg`` by the migration's own code, each emptied after a test
    and handed to the next one of this pytest process (making a pair took most of a test's
    time); dropped by the migration's code at the end."""
    pool = TablePool(drop=_drop_migrated)
    yield pool
    pool.close()


def _migrated_store(prefix: str, create: bool) -> SqlStore:
    """The store on ``pg``'s pair under ``prefix``, made first by the migration if ``create``."""
    if create:
        with _migrating(prefix), connections["pg"].schema_editor() as editor:
            create_tables(None, editor)
    return database_store("pg", table_prefix=prefix)


def _drop_migrated(store: SqlStore) -> None:
    with _migrating(store.table_prefix), connections["pg"].schema_editor() as editor:
        drop_tables(None, editor)
    store.close()
    connections["pg"].close()


def _migrating(prefix: str) -> override_settings:
    return override_settings(SAGAS={"store": "django://pg", "table_prefix": prefix})


@pytest.mark.postgres
class TestDjangoStoreOnPostgres(StoreConformance):
    """The conformance suite over tables the migration made on PostgreSQL through Django."""

    @pytest.fixture(autouse=True)
    def _services(self, postgres_url: str, migrated_pairs: TablePool) -> None:
        self._pairs = migrated_pairs

    def make_store(self) -> Store:
        return self._pairs.borrow("pg", "c" + uuid.uuid4().hex[:10] + "_", _migrated_store)

    def destroy_store(self, store: Store) -> None:
        self._pairs.give_back("pg", store)
        store.close()
        connections["pg"].close()

    def corrupt(self, store: Store, kind: str, record_id: str) -> None:
        assert isinstance(store, SqlStore)
        statement = text(f"UPDATE {store.table_prefix}envelopes SET body = :body "
                         "WHERE kind = :kind AND id = :id")
        with store.engine.begin() as connection:
            connection.execute(statement, {"body": GARBAGE, "kind": kind, "id": record_id})
