"""The saga tables, created and dropped by this app's migration (``migrations/0001_initial``).

The DDL is SQLAlchemy's for the SQL store (docs/design.md §4.3), compiled for the migrating
connection's database and run through Django's schema editor, so it is part of the migration
(and of its transaction where the database has transactional DDL). Only the database the saga
store names (``django://<alias>``) gets the tables; tables already there are left alone.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable, DropTable

from ...stores.sql._schema import Tables, build_tables
from . import _settings

__all__ = ["create_tables", "drop_tables"]

_DIALECTS = {"postgresql": postgresql.dialect, "mysql": mysql.dialect, "sqlite": sqlite.dialect}


def create_tables(apps: Any, schema_editor: Any) -> None:
    """Create the envelopes and leases tables with their indexes (forward migration)."""
    for table, dialect in _saga_tables(schema_editor, present=False):
        schema_editor.execute(str(CreateTable(table).compile(dialect=dialect)))
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            schema_editor.execute(str(CreateIndex(index).compile(dialect=dialect)))


def drop_tables(apps: Any, schema_editor: Any) -> None:
    """Drop both tables (backward migration): every saga record goes with them."""
    for table, dialect in reversed(_saga_tables(schema_editor, present=True)):
        schema_editor.execute(str(DropTable(table).compile(dialect=dialect)))


def _saga_tables(schema_editor: Any, *, present: bool) -> list[tuple[Table, Dialect]]:
    """The saga tables (envelopes first) the connection has (``present``) or lacks, each with
    the connection's dialect; none on a database other than the saga store's."""
    target = _target(schema_editor)
    if target is None:
        return []
    tables, dialect, existing = target
    return [(table, dialect) for table in (tables.envelopes, tables.leases)
            if (table.name in existing) == present]


def _target(schema_editor: Any) -> tuple[Tables, Dialect, set[str]] | None:
    """The saga tables, the connection's dialect and the tables it has, when this connection is
    the saga store's database; None for any other database."""
    connection = schema_editor.connection
    if connection.alias != _settings.database_alias():
        return None
    tables = build_tables(_settings.table_prefix())
    return tables, _dialect(schema_editor), set(connection.introspection.table_names())


def _dialect(schema_editor: Any) -> Dialect:
    vendor = schema_editor.connection.vendor
    if vendor not in _DIALECTS:
        raise NotImplementedError(f"the saga tables cannot be created on a {vendor} database")
    dialect: Dialect = _DIALECTS[vendor]()
    return dialect
