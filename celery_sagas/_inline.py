"""Inline continuation: the next step runs in the process that settled the previous one
(docs/design.md §3.2).

A saga that opts in (``@sagas.saga(name, inline=True)`` or ``sagas_inline_steps``) has its
next step claimed by the very write that settles the step before it, and that step's body runs
at once in the same worker process: one store write and no broker hop per step. Everything
else is as for a sent step: the step has its own effect id, its own claim (written with the
settle, under a fresh claim tag) and its own time limit, and a crash during its body leaves a
claimed step that the sweep judges exactly like a crash after a claimed delivery.

This module holds what the engine layer needs: the budget that bounds one chain of inline
steps, the port through which the integration layer runs a step's task in this process
(``InlineRunner``), and a per-thread hand-over: the effect ids whose message must not be sent
(this process runs them) and the records claimed for them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from ._records import SagaRecord, StepRecord

__all__ = ["InlineBudget", "InlineRunner", "held", "holding", "take_claim"]


@dataclass(frozen=True, slots=True)
class InlineBudget:
    """What a chain of inline steps may still use (times on ``time.monotonic``): steps, until
    when a new one may start, and when the running task's hard limit ends (None: no limit)."""

    steps_left: int
    start_by: float
    hard_end: float | None

    def allows(self, time_limit_ms: int) -> bool:
        """Whether one more step whose time limit is ``time_limit_ms`` may start now."""
        now = time.monotonic()
        fits = self.hard_end is None or now + time_limit_ms / 1000 <= self.hard_end
        return self.steps_left > 0 and now <= self.start_by and fits

    def spent(self) -> InlineBudget:
        """The budget after one more inline step."""
        return InlineBudget(self.steps_left - 1, self.start_by, self.hard_end)


class InlineRunner(Protocol):
    """Runs a step's task in this process (the integration layer: Celery's task, signals,
    tracing), for a delivery that claimed it with its settle."""

    def eligible(self, saga: SagaRecord, step: StepRecord) -> bool:
        """Whether ``step`` may run here now (its queue, rate limit and time limit, the
        saga's and the step's choice, the budget)."""
        ...

    def run(self, saga: SagaRecord, step: StepRecord) -> None:
        """Run ``step``'s task here; its delivery finds the claim with ``take_claim``."""
        ...


class _HandOver(threading.local):
    def __init__(self) -> None:
        self.held: set[str] = set()
        self.claims: dict[str, tuple[SagaRecord, str]] = {}


_local = _HandOver()


@contextmanager
def holding(effect_id: str, claimed: SagaRecord, tag: str) -> Iterator[None]:
    """Within the block, the message of ``effect_id`` is not sent (``held``) and its delivery
    in this thread finds ``claimed`` (claimed under ``tag``) instead of claiming again."""
    _local.held.add(effect_id)
    _local.claims[effect_id] = (claimed, tag)
    try:
        yield
    finally:
        _local.held.discard(effect_id)
        _local.claims.pop(effect_id, None)


def held(effect_id: str) -> bool:
    """Whether this thread runs ``effect_id`` inline (so its message must not be sent)."""
    return effect_id in _local.held


def take_claim(effect_id: str) -> tuple[SagaRecord, str] | None:
    """The record claimed for ``effect_id`` by this thread's settle, and its claim tag (once)."""
    return _local.claims.pop(effect_id, None)
