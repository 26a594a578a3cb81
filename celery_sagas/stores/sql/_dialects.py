"""Every difference between PostgreSQL, SQLite and MySQL/MariaDB the SQL store cares about.

- column types: ASCII keys compared byte-wise (PostgreSQL ``COLLATE "C"``, MySQL
  ``ascii_bin``, SQLite's default BINARY), bodies large enough for 1 MiB+ of UTF-8;
- insert-if-absent: ``ON CONFLICT DO NOTHING`` on PostgreSQL and SQLite, the duplicate-key
  error 1062 on MySQL/MariaDB (``INSERT IGNORE`` would also swallow other errors);
- ``UPDATE ... RETURNING`` where the dialect has it (PostgreSQL, SQLite >= 3.35), else the
  update and a read-back (MySQL/MariaDB): a lease row by its new token, an annotated record
  inside an explicit ``BEGIN``/``COMMIT`` around the two statements;
- text appended with ``||`` (PostgreSQL, SQLite) or ``CONCAT`` (MySQL/MariaDB, where ``||``
  means OR), ``GREATEST`` (PostgreSQL, MySQL/MariaDB) or the scalar ``max`` (SQLite), and
  ``IS NOT DISTINCT FROM`` spelled ``IS`` on SQLite and ``<=>`` on MySQL/MariaDB;
- engine defaults: autocommit (each primitive is one statement, so a transaction block would
  only add BEGIN/COMMIT round trips), hidden parameters, a bounded pool; SQLite files get WAL
  and a busy timeout, an in-memory SQLite one connection every thread shares in turn.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    Row,
    Select,
    String,
    Table,
    Text,
    case,
    event,
    func,
    insert,
    literal,
    or_,
    select,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Dialect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.pool import QueuePool
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.dml import ReturningUpdate, Update
from sqlalchemy.types import TypeEngine

from ...errors import StoreUnavailable

__all__ = [
    "SQLITE_BUSY_TIMEOUT_MS",
    "append_line",
    "ascii_key",
    "check_supported",
    "engine_settings",
    "insert_if_absent",
    "is_duplicate_key",
    "is_memory_sqlite",
    "long_text",
    "newline_count",
    "prepare_engine",
    "same_or_both_null",
    "update_returning",
    "update_returning_in_transaction",
]

SUPPORTED = frozenset({"postgresql", "sqlite", "mysql", "mariadb"})
SQLITE_BUSY_TIMEOUT_MS = 15_000
MYSQL_DUPLICATE_KEY = 1062
_MYSQL = ("mysql", "mariadb")
_NEWLINE = literal("\n", Text)


def check_supported(dialect: Dialect) -> None:
    """Refuse a dialect the store was not built and tested for."""
    if dialect.name not in SUPPORTED:
        raise StoreUnavailable(
            f"the SQL store supports PostgreSQL, SQLite and MySQL/MariaDB, not {dialect.name!r}"
        )


def ascii_key(length: int) -> TypeEngine[str]:
    """An indexed ASCII column compared byte-wise, so ids differing in case stay distinct."""
    return (
        String(length)
        .with_variant(String(length, collation="C"), "postgresql")
        .with_variant(mysql.VARCHAR(length, charset="ascii", collation="ascii_bin"), *_MYSQL)
    )


def long_text() -> TypeEngine[str]:
    """Unbounded UTF-8 text (MySQL's TEXT stops at 64 KiB, so LONGTEXT there)."""
    return Text().with_variant(mysql.LONGTEXT(charset="utf8mb4", collation="utf8mb4_bin"), *_MYSQL)


def is_memory_sqlite(url: URL) -> bool:
    """True for a SQLite database that lives only in process memory."""
    if url.get_backend_name() != "sqlite":
        return False
    database = url.database or ""
    mode = url.query.get("mode")
    return database in ("", ":memory:") or database.startswith("file::memory:") or mode == "memory"


def engine_settings(url: URL, options: Mapping[str, Any]) -> tuple[URL, dict[str, Any]]:
    """The URL and ``create_engine`` options the store uses; caller options win."""
    merged: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", "hide_parameters": True}
    backend = url.get_backend_name()
    if is_memory_sqlite(url):
        # one connection (one database), handed to one thread at a time
        merged.update(poolclass=QueuePool, pool_size=1, max_overflow=0)
        merged["connect_args"] = {"check_same_thread": False}
    elif backend == "sqlite":
        merged["connect_args"] = {"check_same_thread": False}
    else:
        merged.update(pool_size=5, max_overflow=10, pool_timeout=30, pool_recycle=1800)
    if backend in _MYSQL and "charset" not in url.query:
        url = url.update_query_dict({"charset": "utf8mb4"})
    merged.update(options)
    return url, merged


def prepare_engine(engine: Engine) -> None:
    """Give every new SQLite connection a busy timeout, and WAL for a file database."""
    if engine.dialect.name != "sqlite":
        return
    wal = not is_memory_sqlite(engine.url)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS:d}")
            if wal:  # concurrent readers alongside the single writer
                _enable_wal(cursor)
        finally:
            cursor.close()

    event.listen(engine, "connect", on_connect)


def _enable_wal(cursor: Any) -> None:
    """Switch the file to WAL, waiting out connections that switch it at the same moment.

    SQLite answers a concurrent journal-mode change with "database is locked" at once, without
    its busy handler, so stores opening a fresh file together retry here until the timeout.
    """
    import sqlite3  # only SQLite engines get here; some Python builds lack the module

    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))


def insert_if_absent(engine: Engine, table: Table, values: Mapping[str, Any]) -> bool:
    """Insert one row in its own transaction unless its primary key exists; True if inserted."""
    name = engine.dialect.name
    stmt = _insert_statement(table, name)
    if name in ("postgresql", "sqlite"):
        with engine.begin() as conn:
            return conn.execute(stmt, dict(values)).rowcount == 1
    try:
        with engine.begin() as conn:
            conn.execute(stmt, dict(values))
    except IntegrityError as exc:
        if is_duplicate_key(exc):
            return False
        raise
    return True


@lru_cache(maxsize=64)
def _insert_statement(table: Table, dialect: str) -> Executable:
    """The insert-if-absent statement of ``table``, built once (values come as parameters)."""
    keys = [column.name for column in table.primary_key.columns]
    stmt: Executable
    if dialect == "postgresql":
        stmt = postgresql.insert(table).on_conflict_do_nothing(index_elements=keys)
    elif dialect == "sqlite":
        stmt = sqlite.insert(table).on_conflict_do_nothing(index_elements=keys)
    else:
        return insert(table)
    # SQLAlchemy keeps an INSERT's rowcount only when asked to
    return stmt.execution_options(preserve_rowcount=True)


def is_duplicate_key(exc: IntegrityError) -> bool:
    """True when MySQL/MariaDB refused an insert for an existing key (error 1062)."""
    orig = exc.orig
    code = getattr(orig, "errno", None)
    if code is None:
        args = getattr(orig, "args", ())
        code = args[0] if args else None
    return code == MYSQL_DUPLICATE_KEY


def update_returning(
    conn: Connection,
    stmt: Update,
    columns: Sequence[ColumnElement[Any]],
    read_back: ColumnElement[bool],
) -> Row[Any] | None:
    """Run a single-row UPDATE and return ``columns`` of the updated row, or None if no row matched.

    Without ``UPDATE ... RETURNING`` (MySQL/MariaDB) the row is read back with ``read_back``,
    which must match only the row as this update left it (e.g. by its new token), so a later
    writer's values are never mistaken for ours.
    """
    if conn.dialect.update_returning:
        return conn.execute(stmt.returning(*columns)).one_or_none()
    if conn.execute(stmt).rowcount != 1:
        return None
    return conn.execute(select(*columns).where(read_back)).one_or_none()


def update_returning_in_transaction(
    engine: Engine,
    returning: ReturningUpdate[Any],
    plain: Update,
    read_back: Select[Any],
    params: Mapping[str, Any],
) -> Row[Any] | None:
    """Run a single-row UPDATE and return the row as it left it, or None if no row matched.

    One ``UPDATE ... RETURNING`` where the dialect has it. Elsewhere (MySQL/MariaDB) the UPDATE
    and the ``read_back`` SELECT share one transaction: the UPDATE's row lock keeps every other
    writer out until the read is done, so the row read is exactly the row written.
    """
    if engine.dialect.update_returning:
        with engine.begin() as conn:
            return conn.execute(returning, params).one_or_none()
    with engine.connect() as conn:
        return _update_then_read(conn, plain, read_back, params)


def _update_then_read(
    conn: Connection, plain: Update, read_back: Select[Any], params: Mapping[str, Any]
) -> Row[Any] | None:
    # An explicit BEGIN, valid on an autocommit connection or not: moving the pooled connection
    # out of autocommit and back through SQLAlchemy costs three more round trips.
    conn.exec_driver_sql("BEGIN")
    try:
        written = conn.execute(plain, params).rowcount == 1
        row = conn.execute(read_back, params).one_or_none() if written else None
    except BaseException:
        with suppress(Exception):  # the first error is the one to report
            conn.exec_driver_sql("ROLLBACK")
        raise
    conn.exec_driver_sql("COMMIT")
    return row


def append_line(text: ColumnElement[str], line: ColumnElement[str]) -> ColumnElement[str]:
    """``text`` with ``line`` appended after a newline; NULL or empty ``text`` becomes ``line``.

    SQLAlchemy renders the concatenation as ``||`` or, on MySQL/MariaDB, ``concat()``.
    """
    return case(
        (or_(text.is_(None), text == ""), line),
        else_=text.concat(_NEWLINE).concat(line),
    )


def newline_count(text: ColumnElement[str]) -> ColumnElement[int]:
    """The newlines in ``text`` (``length`` counts bytes on MySQL, characters elsewhere: a
    newline is one of either)."""
    return func.length(text) - func.length(func.replace(text, _NEWLINE, ""))


def same_or_both_null(column: ColumnElement[Any], value: ColumnElement[Any]) -> ColumnElement[bool]:
    """``column IS NOT DISTINCT FROM value``: ``IS`` on SQLite, ``<=>`` on MySQL/MariaDB."""
    return column.is_not_distinct_from(value)
