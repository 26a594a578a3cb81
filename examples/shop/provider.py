"""A fake external provider that records every effect by its idempotency key.

Real payment and inventory APIs accept an idempotency key and return the first answer for a
repeated key. This one does the same over a SQLite file shared by every worker process, so
the example (and its tests) can count how often each side effect really happened.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Provider", "ProviderDeclined", "provider"]


class ProviderDeclined(Exception):
    """The provider refused the request; nothing was done."""


class Provider:
    """Effects keyed by idempotency key: a repeated key returns the first answer."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, service TEXT,"
                " action TEXT, answer TEXT, seq INTEGER)"
            )

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            yield db
        finally:
            db.close()

    def call(self, key: str, service: str, action: str, answer: dict[str, Any]) -> dict[str, Any]:
        """Perform ``action`` once per ``key`` and return its (first) answer."""
        with self._lock, self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT answer FROM effects WHERE key = ?", (key,)).fetchone()
            if row is None:
                seq = db.execute("SELECT COUNT(*) FROM effects").fetchone()[0] + 1
                db.execute(
                    "INSERT INTO effects VALUES (?, ?, ?, ?, ?)",
                    (key, service, action, json.dumps(answer), seq),
                )
            db.execute("COMMIT")
        return answer if row is None else dict(json.loads(row[0]))

    def has(self, key: str) -> bool:
        """Whether an effect was performed under ``key`` (a lookup by request id)."""
        with self._db() as db:
            return db.execute("SELECT 1 FROM effects WHERE key = ?", (key,)).fetchone() is not None

    def effects(self) -> list[tuple[str, str, str]]:
        """Every effect performed, in order: (service, action, key)."""
        with self._db() as db:
            rows = db.execute("SELECT service, action, key FROM effects ORDER BY seq").fetchall()
        return [(r[0], r[1], r[2]) for r in rows]


def provider() -> Provider:
    """The provider of this process, at ``SHOP_PROVIDER_DB`` (a file shared by workers)."""
    global _provider
    path = os.environ.get("SHOP_PROVIDER_DB", "shop-provider.db")
    if _provider is None or _provider.path != path:
        _provider = Provider(path)
    return _provider


_provider: Provider | None = None
