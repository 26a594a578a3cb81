"""The Redis store: key layout, Lua scripts, and ``RedisStore`` (docs/design.md §4.2)."""

from __future__ import annotations

from .store import RedisStore

__all__ = ["RedisStore"]
