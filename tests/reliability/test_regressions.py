"""Regression tests for defects the reliability suite found (each names its finding)."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas
from celery_sagas._codec import Codec
from celery_sagas._definitions import Registry, SagaDefinition, StepOptions
from celery_sagas._engine import Engine
from celery_sagas._protocol import moves
from celery_sagas._repository import SagaRepository
from celery_sagas.errors import SagaConcurrencyError, SagaConfigurationError, SagaValidationError
from celery_sagas.testing.clock import FrozenClock
from celery_sagas.testing.dispatcher import RecordingDispatcher
from celery_sagas.testing.racing import ReadTogether, race

pytestmark = pytest.mark.e2e

DURATIONS = ["sweep_interval", "stale_after", "ambiguity_grace", "default_time_limit",
             "sweep_lease", "approval_ttl"]


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize("value", [math.inf, math.nan, 1e300, 2**63, 367 * 24 * 3600])
def test_a_duration_setting_that_is_infinite_or_absurd_is_refused_at_construction(
    name: str, value: float
) -> None:
    # Found by the settings fuzz: inf raised OverflowError; 1e300 was accepted and every
    # later sweep failed, after the saga had been stored.
    with pytest.raises(SagaConfigurationError, match=f"sagas_{name}"):
        Sagas(Celery("regression", set_as_current=False), store=MemoryStore(),
              allow_non_durable=True, **{name: value})


@pytest.mark.parametrize("name", DURATIONS)
def test_a_duration_setting_of_a_year_is_still_accepted(name: str) -> None:
    sagas = Sagas(Celery("regression", set_as_current=False), store=MemoryStore(),
                  allow_non_durable=True, **{name: 365 * 24 * 3600})
    assert sagas.settings.sweep_lease_ms > 0


def _engine() -> tuple[Engine, FrozenClock]:
    registry = Registry()
    registry.add_step(StepOptions(task="regression.work", compensator=None))
    registry.add_definition(SagaDefinition("regression", lambda ctx, data: ctx.step("regression.work")))
    clock = FrozenClock()
    repository = SagaRepository(MemoryStore(), Codec())
    return Engine(repository, registry, RecordingDispatcher(), clock=clock), clock


def test_two_writers_of_the_same_move_from_the_same_version_are_not_both_told_they_won() -> None:
    # Found by the 16-thread resume race: threads that computed the identical next record in
    # the same millisecond were all told their compare-and-set won (the store reports an
    # identical stored record as an "already applied" retry), so two of them dispatched the
    # compensator and emitted its events. docs/design.md: exactly one writer of version N succeeds.
    engine, clock = _engine()
    record = engine.start("regression", {"n": 1}, "same-move")
    after = moves.to_manual_review(record, "run_failed", "for the test", clock.now_ms())
    engine.repository.write(record, after)
    with pytest.raises(SagaConcurrencyError):
        engine.repository.write(record, after)


def test_sixteen_threads_resuming_one_saga_in_the_same_millisecond_lift_the_review_once() -> None:
    engine, clock = _engine()
    record = engine.start("regression", {"n": 1}, "resume-race")
    review = engine.repository.write(
        record, moves.to_manual_review(record, "run_failed", "x", clock.now_ms()))
    wins: list[str] = []
    store = engine.repository.store
    original = store.compare_and_set
    before, after, first = (threading.Barrier(16, timeout=60), threading.Barrier(16, timeout=60),
                            threading.local())

    def counting(envelope: Any, expected: int, **kwargs: Any) -> bool:
        # Every racer's first write is its resume: all are sent before any racer goes on.
        racing = not getattr(first, "done", False)
        first.done = True
        if racing:
            before.wait()
        ok = original(envelope, expected, **kwargs)
        if ok and expected == review.version:
            wins.append(envelope.state)
        if racing:
            after.wait()
        return ok

    store.compare_and_set = counting  # type: ignore[method-assign]
    # all 16 judge the review before any writes
    engine.repository = SagaRepository(ReadTogether(store, parties=16), Codec())
    results = race(lambda _: engine.resume("resume-race"), threads=16)
    assert not [r for r in results if isinstance(r, BaseException)]
    assert wins == ["running"], (wins, results)


def _one_running_saga() -> Sagas:
    """In-process Sagas with one saga ``running`` whose first step's message was never sent."""
    sagas = Sagas(Celery("regression", set_as_current=False), store=MemoryStore(),
                  allow_non_durable=True)
    sagas.dispatcher = RecordingDispatcher()

    @sagas.step(name="regression.work", compensate=None)
    def work() -> None:
        return None

    sagas.saga("regression")(lambda ctx, data: ctx.step(work))
    sagas.start("regression", {}, saga_id="running")
    return sagas


@pytest.mark.parametrize(("timeout", "interval"), [
    (math.nan, 0.05), (None, 0.05), ("5", 0.05), (-1, 0.05), (math.inf, 0.05), (10**400, 0.05),
    (0.01, -1), (0.01, 0), (0.01, math.nan), (0.01, None),
])
def test_wait_refuses_a_timeout_or_interval_that_is_not_a_finite_number_of_seconds(
    timeout: Any, interval: Any,
) -> None:
    # Found by the wait fuzz: timeout=NaN never timed out (wait hung on a running saga);
    # None or a string raised TypeError, a negative interval ValueError from time.sleep.
    sagas = _one_running_saga()
    with pytest.raises(SagaValidationError):
        sagas.wait("running", timeout=timeout, interval=interval)


def test_wait_with_a_zero_timeout_reports_the_running_saga_at_once() -> None:
    sagas = _one_running_saga()
    with pytest.raises(TimeoutError):
        sagas.wait("running", timeout=0)
