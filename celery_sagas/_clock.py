"""Time enters the library here, so tests can control it."""

from __future__ import annotations

import time
from typing import Protocol

from ._values import timestamp_ms

__all__ = ["Clock", "SystemClock", "now_ms"]


class Clock(Protocol):
    """A source of wall-clock time in integer milliseconds since the epoch."""

    def now_ms(self) -> int:
        """Return the current time in milliseconds."""
        ...


class SystemClock:
    """The real wall clock."""

    def now_ms(self) -> int:
        """Return ``time.time()`` in whole milliseconds."""
        return time.time_ns() // 1_000_000


def now_ms(clock: Clock) -> int:
    """Read a clock and refuse anything that is not a valid timestamp (docs/design.md §2.5)."""
    return timestamp_ms(clock.now_ms(), field="clock reading")
