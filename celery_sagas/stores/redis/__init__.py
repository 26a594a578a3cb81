"""The Redis store: key layout, Lua scripts, and ``RedisStore`` (SPEC §6, DESIGN §3)."""

from __future__ import annotations

from .store import RedisStore

__all__ = ["RedisStore"]
