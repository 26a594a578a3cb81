"""Does the SQL server keep the commits it acknowledged? Read on an engine's first connection
checkout (docs/guarantees.md#durability).

A server can be told to acknowledge a commit before it is on disk: PostgreSQL ``fsync = off``
or ``synchronous_commit = off``, MySQL/MariaDB ``innodb_flush_log_at_trx_commit`` other than 1,
SQLite ``PRAGMA synchronous = OFF``. The store then works, but a crash can take back a write it
reported done (a claim, an outcome, a fence), so a step may run twice. Each finding is logged
as one WARNING per process and server; a setting that cannot be read is passed over.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, event

from .._durability import warn_once

__all__ = ["commit_durability"]

_FIX = "so a step may run twice"
_POSTGRES = {
    "fsync": ("off", "fsync = off: an operating-system crash or power loss can lose or corrupt "
                     f"commits the store acknowledged, {_FIX}; set fsync = on"),
    "synchronous_commit": ("off", "synchronous_commit = off: a server crash loses the last "
                                  "commits (up to 3 x wal_writer_delay) the store acknowledged, "
                                  f"{_FIX}; set it to on for the store's role or database"),
}
_MYSQL_FLUSH = {
    "0": "innodb_flush_log_at_trx_commit = 0: even a crash of the server loses up to a second "
         f"of commits the store acknowledged, {_FIX}; set it to 1",
    "2": "innodb_flush_log_at_trx_commit = 2: an operating-system crash or power loss loses up "
         f"to a second of commits the store acknowledged, {_FIX}; set it to 1",
}
_SQLITE_OFF = (f"PRAGMA synchronous = OFF: an operating-system crash or power loss can lose or "
               f"corrupt commits the store acknowledged, {_FIX}; use NORMAL (in WAL mode) or FULL")


class CommitDurability:
    """What the first connection of one engine told about its server."""

    def __init__(self, engine: Engine) -> None:
        self._server = engine.url.render_as_string(hide_password=True)
        self._dialect = engine.dialect.name
        self._lock = threading.Lock()
        self._done = False
        self.durable = True

    def on_checkout(self, dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        """Read the server's settings on the first checkout; warn once per lossy one."""
        if self._done or not self._claim():
            return
        problems = _read(self._dialect, dbapi_connection)
        for problem in problems:
            self.durable = False
            warn_once(problem.split(":", 1)[0], self._server,
                      f"the SQL store's server {self._server} runs with {problem}")

    def _claim(self) -> bool:
        """True for the one caller that makes the check."""
        with self._lock:
            first, self._done = not self._done, True
            return first


_by_engine: weakref.WeakKeyDictionary[Engine, CommitDurability] = weakref.WeakKeyDictionary()
_by_engine_lock = threading.Lock()


def commit_durability(engine: Engine) -> CommitDurability:
    """The one check of ``engine`` (made on its first connection checkout from now on)."""
    with _by_engine_lock:
        found = _by_engine.get(engine)
        if found is None:
            found = _by_engine[engine] = CommitDurability(engine)
            event.listen(engine, "checkout", found.on_checkout)
        return found


def _read(dialect: str, connection: Any) -> list[str]:
    """The lossy settings of the server behind a DBAPI connection; [] when none or unreadable."""
    readers: dict[str, Callable[[Any], list[str]]] = {
        "postgresql": _postgres, "mysql": _mysql, "mariadb": _mysql, "sqlite": _sqlite,
    }
    reader = readers.get(dialect)
    if reader is None:
        return []
    try:
        return reader(connection)
    except Exception:  # a setting the role may not read: nothing is known, nothing is said
        return []
    finally:
        _end_transaction(connection)


def _postgres(connection: Any) -> list[str]:
    found = []
    for name, (lossy, problem) in _POSTGRES.items():
        if str(_value(connection, f"SHOW {name}")).lower() == lossy:
            found.append(problem)
    return found


def _mysql(connection: Any) -> list[str]:
    problem = _MYSQL_FLUSH.get(str(_value(connection, "SELECT @@innodb_flush_log_at_trx_commit")))
    return [problem] if problem else []


def _sqlite(connection: Any) -> list[str]:
    return [_SQLITE_OFF] if str(_value(connection, "PRAGMA synchronous")) == "0" else []


def _value(connection: Any, statement: str) -> object:
    cursor = connection.cursor()
    try:
        cursor.execute(statement)
        row = cursor.fetchone()
    finally:
        cursor.close()
    return row[0] if row else None


def _end_transaction(connection: Any) -> None:
    """Leave the connection as the pool handed it: a read may have opened a transaction."""
    with contextlib.suppress(Exception):  # an autocommit connection may refuse: nothing is open
        connection.rollback()
