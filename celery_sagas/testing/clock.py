"""FrozenClock: a clock that moves only when a test says so."""

from __future__ import annotations

import threading

from .._values import duration_ms, timestamp_ms

__all__ = ["FrozenClock"]

DEFAULT_START_MS = 1_700_000_000_000


class FrozenClock:
    """A thread-safe ``Clock`` whose time is set or advanced explicitly (tests, demos)."""

    def __init__(self, now_ms: int = DEFAULT_START_MS) -> None:
        self._lock = threading.Lock()
        self._now_ms = timestamp_ms(now_ms, field="clock start")

    def now_ms(self) -> int:
        """Return the frozen time in milliseconds."""
        with self._lock:
            return self._now_ms

    def set(self, now_ms: int) -> None:
        """Jump to ``now_ms`` (backwards too: tests of clock skew need it)."""
        value = timestamp_ms(now_ms, field="clock time")
        with self._lock:
            self._now_ms = value

    def advance(self, delta_ms: int) -> int:
        """Move forward by a positive ``delta_ms`` and return the new time."""
        step = duration_ms(delta_ms, field="clock advance")
        with self._lock:
            self._now_ms = timestamp_ms(self._now_ms + step, field="clock time")
            return self._now_ms
