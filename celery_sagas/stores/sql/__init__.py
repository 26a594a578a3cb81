"""The SQL store: PostgreSQL, SQLite and MySQL/MariaDB through SQLAlchemy 2 Core."""

from __future__ import annotations

from .store import SqlStore

__all__ = ["SqlStore"]
