"""What is costly to make and that a test leaves as it found it, kept for the next test of the
same pytest process (the nothing-written matrices' stores full of sagas).

A kept thing is handed on only as it was made: after each test its clock is set back, and a
store whose dump differs from its dump when made (a test took a lease, or a call wrote) is
closed and made again for the next test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from celery_sagas import MemoryStore
from celery_sagas.testing import FrozenClock

__all__ = ["Kept", "close_all", "handed_on", "memory_dump"]

T = TypeVar("T")


@dataclass
class Kept(Generic[T]):
    """A thing made once, with its store's dump and its clock as they were when made."""

    value: T
    dump: Callable[[], Any]
    clock: FrozenClock
    close: Callable[[], None] = lambda: None
    built: Any = field(init=False)
    now_ms: int = field(init=False)

    def __post_init__(self) -> None:
        self.built = self.dump()
        self.now_ms = self.clock.now_ms()


def handed_on(kept: dict[str, Kept[T]], key: str, make: Callable[[], Kept[T]]) -> Iterator[T]:
    """For one test, ``kept[key]``'s value (made first if missing); then its clock goes back,
    and it is closed and dropped if its store differs from when it was made."""
    if key not in kept:
        kept[key] = make()
    each = kept[key]
    yield each.value
    each.clock.set(each.now_ms)
    if each.dump() != each.built:
        del kept[key]
        each.close()


def close_all(kept: dict[str, Kept[Any]]) -> None:
    """Close every kept thing (at the end of the module that kept them)."""
    for each in kept.values():
        each.close()
    kept.clear()


def memory_dump(store: MemoryStore) -> Any:
    """Everything a MemoryStore holds: records with their notes, leases, fences, cursors."""
    return ({k: (e.version, e.state, e.body, e.notes) for k, e in store._records.items()},
            dict(store._leases), dict(store._fences), dict(store._cursors))
