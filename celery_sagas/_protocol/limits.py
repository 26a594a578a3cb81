"""Limits that hold by construction (docs/concepts.md "Limits"): how deep child sagas nest, how
many children one saga starts, and how many signals (and bytes of them) wait unconsumed in one
saga. Each is checked before the write that would break it, so no input grows a saga tree or a
record without bound; each error names the ``sagas_*`` setting that sets it.

Pure: the checks read records and sizes handed in, never a store.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._records import SagaRecord
from .._values import encode_json
from ..errors import SignalLimitExceeded
from .children import child_id_of

__all__ = ["Limits", "child_count", "child_position", "signal_room", "unconsumed"]


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds a saga tree and its signals stay within (counts, and bytes of JSON)."""

    child_depth: int = 8
    children: int = 1000
    signals: int = 100
    signal_bytes: int = 256 * 1024


def child_count(saga: SagaRecord) -> int:
    """How many child steps ``saga`` has recorded."""
    return sum(1 for step in saga.steps if child_id_of(step) is not None)


def child_position(saga: SagaRecord, step_name: str) -> int:
    """The 1-based position of the child step ``step_name`` among the saga's child steps."""
    position = 0
    for step in saga.steps:
        if child_id_of(step) is not None:
            position += 1
            if step.name == step_name:
                return position
    return position + 1


def unconsumed(saga: SagaRecord) -> tuple[int, int]:
    """(count, JSON bytes of payloads) of the signals no wait consumed yet."""
    waiting = [s for s in saga.signals if s.consumed_by is None]
    size = sum(len(encode_json(s.payload, limit=2**53).encode("utf-8")) for s in waiting)
    return len(waiting), size


def signal_room(saga: SagaRecord, size: int, limits: Limits) -> None:
    """Refuse one more unconsumed signal of ``size`` bytes when it would pass a limit."""
    count, held = unconsumed(saga)
    if count + 1 > limits.signals:
        raise SignalLimitExceeded(saga_id=saga.saga_id, setting="sagas_signal_limit",
                                  limit=limits.signals, held=count)
    if held + size > limits.signal_bytes:
        raise SignalLimitExceeded(saga_id=saga.saga_id, setting="sagas_signal_bytes_limit",
                                  limit=limits.signal_bytes, held=held)
