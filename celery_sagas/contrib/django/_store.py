"""The SQL store on a Django database (``django://<alias>``): same server and database, its own
connection pool in autocommit (a saga write never joins a Django transaction), tables made by
this app's migration."""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

from django.db import connections
from django.db.utils import ConnectionDoesNotExist
from sqlalchemy import inspect
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from ...errors import SagaConfigurationError, StoreUnavailable
from ...stores.sql import SqlStore
from . import _settings

__all__ = ["database_store", "database_url", "open_django_store"]

# OPTIONS that configure Django's own connection, not the database client library.
_DJANGO_ONLY = frozenset({
    "isolation_level", "server_side_binding", "pool", "assume_role", "context", "cursor_factory",
    "prepare_threshold", "transaction_mode", "init_command",
})


def open_django_store(url: str, **options: Any) -> SqlStore:
    """The ``celery_sagas.stores`` entry point of ``django://<alias>`` URLs."""
    alias = _settings.database_alias(url)
    if alias is None:
        raise SagaConfigurationError(f"not a django:// store URL: {url[:80]!r}")
    return database_store(alias, **options)


def database_store(alias: str = "default", *, table_prefix: str | None = None) -> SqlStore:
    """The saga store on Django database ``alias``; SagaConfigurationError when its tables are
    missing (run ``python manage.py migrate``)."""
    prefix = table_prefix if table_prefix is not None else _settings.table_prefix()
    store = SqlStore.from_url(database_url(alias), table_prefix=prefix, create_schema=False)
    try:
        _require_tables(store, alias)
    except BaseException:
        store.close()
        raise
    return store


def database_url(alias: str) -> str:
    """A SQLAlchemy URL for the database Django's ``alias`` connects to, read now (a test
    database, once created, is the one named)."""
    try:
        connection = connections[alias]
    except ConnectionDoesNotExist:
        raise SagaConfigurationError(f"no Django database {alias!r} for the saga store") from None
    given: dict[str, Any] = connection.settings_dict
    vendor = connection.vendor
    if vendor == "sqlite":
        return _sqlite_url(str(given["NAME"]))
    if vendor not in ("postgresql", "mysql"):
        raise SagaConfigurationError(f"the saga store cannot use a {vendor} database")
    host, query = str(given.get("HOST") or ""), _client_options(given.get("OPTIONS") or {})
    if host.startswith("/"):  # a Unix socket directory
        host, query = "", {**query, "host": host}
    url = URL.create(
        _driver(vendor), username=given.get("USER") or None, password=given.get("PASSWORD") or None,
        host=host or None, port=int(given["PORT"]) if given.get("PORT") else None,
        database=str(given["NAME"]), query=query,
    )
    return url.render_as_string(hide_password=False)


def _driver(vendor: str) -> str:
    if vendor == "postgresql":
        return "postgresql+psycopg" if find_spec("psycopg") else "postgresql+psycopg2"
    return "mysql+pymysql" if find_spec("pymysql") else "mysql+mysqldb"


def _sqlite_url(name: str) -> str:
    if name in ("", ":memory:") or "mode=memory" in name:
        raise SagaConfigurationError(
            "the saga store needs a database other processes can open; Django's SQLite database "
            f"{name!r} lives in one process's memory"
        )
    return f"sqlite:///{name}"


def _client_options(options: dict[str, Any]) -> dict[str, str]:
    """The OPTIONS the client library understands, as URL query values."""
    return {key: str(value) for key, value in options.items()
            if key not in _DJANGO_ONLY and isinstance(value, (str, int)) and not isinstance(value, bool)}


def _require_tables(store: SqlStore, alias: str) -> None:
    names = [f"{store.table_prefix}envelopes", f"{store.table_prefix}leases"]
    try:
        inspector = inspect(store.engine)
        missing = [name for name in names if not inspector.has_table(name)]
    except SQLAlchemyError as exc:
        raise StoreUnavailable(f"the saga store cannot reach Django database {alias!r}") from exc
    if missing:
        raise SagaConfigurationError(
            f"the saga tables {', '.join(missing)} are missing from Django database {alias!r}: add "
            "'celery_sagas.contrib.django' to INSTALLED_APPS and run `python manage.py migrate`"
        )
