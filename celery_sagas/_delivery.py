"""Running one step or compensator delivery: claim, run the body, record the outcome, go on.

A delivery first claims the start with a CAS; a duplicate that loses the claim, or finds the
attempt running elsewhere, does nothing. A delivery that finds the attempt started by a
process known to be gone settles it as the protocol says (ambiguous, or retried when the step
is idempotent). After the body, the outcome is recorded with a CAS (reloading on a lost race,
retrying while the store is unreachable) and the saga advances in this same process, so the
next step costs no extra broker round trip.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import _values as values
from ._context import StepContext
from ._definitions import StepOptions
from ._engine import Engine
from ._events import Phase, Stage
from ._liveness import claim_tag, dead_effects
from ._protocol import codes, moves
from ._protocol.compensation import check_backoff
from ._protocol.decide import judge_in_flight
from ._protocol.decisions import Vanished
from ._records import SagaRecord, SagaState, StepRecord, StepState
from ._wakeups import schedule
from .errors import (
    IllegalTransition,
    PayloadTooLarge,
    SagaConcurrencyError,
    SagaValidationError,
    StepNotCommitted,
    StoreError,
)

__all__ = ["execute_compensation", "execute_step"]

logger = logging.getLogger("celery_sagas.execution")

StepBody = Callable[[StepContext, tuple[Any, ...], Mapping[str, Any]], Any]
CompensationBody = Callable[[StepContext, tuple[Any, ...], Mapping[str, Any], Any], Any]

_STORE_RETRY_S = 30.0
_INLINE_RETRY_MAX_MS = 5_000


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What a body did: committed (result), failed (known), errored (unknown)."""

    kind: str
    result: Any = None
    error_code: str | None = None


def _error_code(exc: BaseException, default: str) -> str:
    """StepNotCommitted's code, or the exception's class in snake case (CardDeclined →
    card_declined)."""
    if isinstance(exc, StepNotCommitted):
        code = getattr(exc, "code", None)
    else:
        code = re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()
    try:
        return values.error_code(code) if code is not None else default
    except SagaValidationError:
        return default


def _lookup(engine: Engine, saga_id: str, name: str, effect_id: str, compensation: bool
            ) -> tuple[SagaRecord, StepRecord] | None:
    saga = engine.get(saga_id)
    step = None if saga is None else saga.step(name)
    if saga is None or step is None:
        logger.warning("saga %s step %s: no such record; message dropped", saga_id, name)
        return None
    expected = step.compensation_effect_id if compensation else step.effect_id
    if expected != effect_id:
        logger.warning("saga %s step %s: message for another effect dropped", saga_id, name)
        return None
    return saga, step


def _settle_vanished(engine: Engine, saga: SagaRecord, step: StepRecord) -> bool:
    """Judge a started attempt found by a new delivery; True when it may be claimed now."""
    policy = engine.registry.policy(engine.definition_of(saga), engine.settings.timing)
    verdict = judge_in_flight(
        step, engine.now(), policy, dead_effects(saga.steps, engine.active),
        rolling_back=saga.rolling_back,
    )
    if not isinstance(verdict, Vanished):
        logger.info("saga %s step %s: attempt still running elsewhere", saga.saga_id, step.name)
        return False
    written = engine.apply(saga, verdict)
    if verdict.retry and not verdict.compensation:
        return True
    engine.advance(saga.saga_id, written)
    return False


def _claim_cached(engine: Engine, saga_id: str, name: str, effect_id: str, tag: str,
                  retrying: bool) -> SagaRecord | None:
    """Claim on the version this process last saw, without reading; None: read and judge."""
    saga = engine.recent.get(saga_id)
    step = None if saga is None else saga.step(name)
    if saga is None or step is None or step.effect_id != effect_id:
        return None
    fresh = step.state is StepState.EXECUTING and step.started_at_ms is None
    if not fresh or saga.state is not SagaState.RUNNING or saga.rolling_back:
        return None
    now = engine.now()
    if not retrying and step.next_attempt_at_ms is not None and now < step.next_attempt_at_ms:
        return None
    try:
        return engine.write(saga, moves.claim_step(saga, name, effect_id, tag, now))
    except SagaConcurrencyError:
        return None


def _claim_step(engine: Engine, saga_id: str, name: str, effect_id: str, tag: str, *,
                retrying: bool = False) -> SagaRecord | None:
    claimed = _claim_cached(engine, saga_id, name, effect_id, tag, retrying)
    if claimed is not None:
        engine.emit(claimed, _step(claimed, name), Stage.EXECUTION, Phase.EXECUTING)
        return claimed
    for _ in range(engine.settings.max_races):
        found = _lookup(engine, saga_id, name, effect_id, compensation=False)
        if found is None:
            return None
        saga, step = found
        if step.state is not StepState.EXECUTING or saga.state is not SagaState.RUNNING:
            if saga.rolling_back:
                engine.advance(saga_id, saga)
            return None
        try:
            if step.started_at_ms is not None:
                if not _settle_vanished(engine, saga, step):
                    return None
                continue
            now = engine.now()
            if not retrying and step.next_attempt_at_ms is not None and now < step.next_attempt_at_ms:
                return None
            claimed = engine.write(saga, moves.claim_step(saga, name, effect_id, tag, now))
        except SagaConcurrencyError:
            continue
        engine.emit(claimed, _step(claimed, name), Stage.EXECUTION, Phase.EXECUTING)
        return claimed
    return None


def _step(saga: SagaRecord, name: str) -> StepRecord:
    step = saga.step(name)
    assert step is not None
    return step


def _run_step_body(body: StepBody, ctx: StepContext, step: StepRecord, options: StepOptions) -> _Outcome:
    known: tuple[type[BaseException], ...] = (StepNotCommitted, *options.not_committed_on)
    try:
        result = body(ctx, step.args, step.kwargs)
    except known as exc:
        return _Outcome("failed", error_code=_error_code(exc, codes.NOT_COMMITTED))
    except Exception as exc:
        logger.warning("saga %s step %s raised %s", ctx.saga_id, ctx.step, type(exc).__name__)
        return _Outcome("errored", error_code=codes.STEP_ERROR)
    try:
        return _Outcome("committed", result=values.json_value(result, field="step result"))
    except SagaValidationError:
        logger.warning("saga %s step %s returned a non-JSON result", ctx.saga_id, ctx.step)
        return _Outcome("errored", error_code="invalid_result")


def _record(engine: Engine, saga: SagaRecord, move: Callable[[SagaRecord], SagaRecord]) -> SagaRecord | None:
    """Write ``move(saga)``; reload on a lost race, wait out an unreachable store."""
    deadline = time.monotonic() + _STORE_RETRY_S
    current: SagaRecord | None = saga
    for _ in range(engine.settings.max_races):
        try:
            if current is None:
                current = engine.load(saga.saga_id)
            return engine.write(current, move(current))
        except IllegalTransition:
            logger.warning("saga %s moved on; outcome not recorded here", saga.saga_id)
            return None
        except SagaConcurrencyError:
            current = None
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
            current = None
    return None


def _forward_move(engine: Engine, options: StepOptions, step: StepRecord, outcome: _Outcome
                  ) -> Callable[[SagaRecord], SagaRecord]:
    name, effect, attempt, now = step.name, step.effect_id, step.attempts, engine.now()
    if outcome.kind == "committed":
        return lambda s: moves.commit_step(s, name, effect, attempt, outcome.result, now)
    code = outcome.error_code or codes.STEP_ERROR
    if outcome.kind == "failed":
        return lambda s: moves.fail_step(s, name, effect, attempt, code, now)
    delay = None
    if attempt < options.max_attempts:
        delay = check_backoff(_safe_backoff(options.backoff, attempt))
    if delay is None:
        return lambda s: moves.step_ambiguous(s, name, effect, attempt, code, now)
    retry_at = now + delay

    def release(s: SagaRecord) -> SagaRecord:
        # No retry is claimed while the saga rolls back (the reload of a lost race may see it).
        if s.rolling_back:
            return moves.step_ambiguous(s, name, effect, attempt, code, now)
        return moves.release_step(s, name, effect, attempt, retry_at, code, now)

    return release


def _safe_backoff(backoff: Callable[[int], int], attempt: int) -> object:
    try:
        return backoff(attempt)
    except Exception:
        return None


_PHASES = {"committed": Phase.COMMITTED, "failed": Phase.FAILED, "errored": Phase.AMBIGUOUS}


def execute_step(engine: Engine, saga_id: str, name: str, effect_id: str, body: StepBody) -> None:
    """Handle one delivery of a step task whose task id is ``effect_id``."""
    tag = claim_tag()
    with engine.active.running(tag):
        written = _deliver(engine, saga_id, name, effect_id, body, tag)
    if written is not None:
        _schedule_later_retry(engine, written, name)
        engine.advance(saga_id, written)


def _deliver(engine: Engine, saga_id: str, name: str, effect_id: str, body: StepBody, tag: str
             ) -> SagaRecord | None:
    """Claim, run and record; a retry due soon runs again here. None: nothing to advance."""
    claimed = _claim_step(engine, saga_id, name, effect_id, tag)
    while claimed is not None:
        written = _attempt(engine, claimed, name, effect_id, body)
        delay = None if written is None else _inline_retry_delay(engine, written, name)
        if delay is None:
            return written
        time.sleep(delay / 1000)
        claimed = _claim_step(engine, saga_id, name, effect_id, tag, retrying=True)
    return None


def _attempt(engine: Engine, claimed: SagaRecord, name: str, effect_id: str, body: StepBody
             ) -> SagaRecord | None:
    """Run the body once and record its outcome; None when it could not be recorded."""
    step = _step(claimed, name)
    options = engine.registry.step(step.task)
    ctx = StepContext(claimed.saga_id, name, effect_id, step.attempts, Stage.EXECUTION)
    started = time.monotonic()
    outcome = _run_step_body(body, ctx, step, options)

    def announce(written: SagaRecord) -> None:
        after = _step(written, name)
        phase = _PHASES[outcome.kind] if after.state is not StepState.EXECUTING else Phase.FAILED
        duration = int((time.monotonic() - started) * 1000)
        engine.emit(written, after, Stage.EXECUTION, phase, outcome.error_code, duration)

    try:
        # A retry stays in this delivery, so only a final outcome is merged with what follows.
        merge = outcome.kind != "errored"
        return _settle(engine, claimed, _forward_move(engine, options, step, outcome), announce,
                       merge=merge)
    except PayloadTooLarge:
        logger.warning("saga %s step %s: result over the payload limit", claimed.saga_id, name)
        outcome = _Outcome("errored", error_code=codes.PAYLOAD_TOO_LARGE)
        move = _forward_move(engine, options, step, outcome)
        return _settle(engine, claimed, move, announce, merge=False)


def _settle(engine: Engine, claimed: SagaRecord, move: Callable[[SagaRecord], SagaRecord],
            announce: Callable[[SagaRecord], None], *, merge: bool) -> SagaRecord | None:
    """Record an outcome, merged with the saga's next decision in one write when it can be."""
    if merge:
        try:
            return engine.settle(claimed, move(claimed), announce)
        except (SagaConcurrencyError, StoreError):
            pass  # somebody else moved the saga, or the store hiccuped: record the outcome alone
    written = _record(engine, claimed, move)
    if written is not None:
        announce(written)
    return written


def _schedule_later_retry(engine: Engine, saga: SagaRecord, name: str) -> None:
    """A released step due later than a delivery waits gets a wake-up for the sweep."""
    step = _step(saga, name)
    due = step.next_attempt_at_ms
    if step.state is StepState.EXECUTING and step.started_at_ms is None and due is not None:
        schedule(engine.store, saga.saga_id, f"retry:{name}:{step.attempts}", due, engine.now())


def _inline_retry_delay(engine: Engine, saga: SagaRecord, name: str) -> int | None:
    """A retry due soon is run in this delivery (no broker hop); later ones go to the sweep."""
    step = _step(saga, name)
    due = step.next_attempt_at_ms
    if step.state is not StepState.EXECUTING or step.started_at_ms is not None or due is None:
        return None
    delay = max(0, due - engine.now())
    return delay if delay <= _INLINE_RETRY_MAX_MS else None


# ------------------------------------------------------------ compensation


def _claim_compensation(engine: Engine, saga_id: str, name: str, effect_id: str, tag: str
                        ) -> SagaRecord | None:
    for _ in range(engine.settings.max_races):
        found = _lookup(engine, saga_id, name, effect_id, compensation=True)
        if found is None:
            return None
        saga, step = found
        if step.state is not StepState.COMPENSATING or saga.state is not SagaState.COMPENSATING:
            return None
        try:
            if step.started_at_ms is not None:
                _settle_vanished(engine, saga, step)
                return None
            now = engine.now()
            claimed = engine.write(
                saga, moves.claim_compensation(saga, name, effect_id, tag, now)
            )
        except SagaConcurrencyError:
            continue
        engine.emit(claimed, _step(claimed, name), Stage.COMPENSATION, Phase.EXECUTING)
        return claimed
    return None


def _backward_move(engine: Engine, saga: SagaRecord, step: StepRecord, error: bool
                   ) -> Callable[[SagaRecord], SagaRecord]:
    name, effect, attempt, now = (
        step.name, step.compensation_effect_id, step.compensation_attempts, engine.now()
    )
    if not error:
        return lambda s: moves.compensation_succeeded(s, name, effect, attempt, now)
    backoff = engine.definition_of(saga).backoff
    delay = check_backoff(_safe_backoff(backoff, attempt))
    if delay is None:
        reason = f"backoff of saga {saga.definition!r} returned an invalid delay"

        def review(s: SagaRecord) -> SagaRecord:
            failed = moves.compensation_failed(s, name, effect, attempt, now, now)
            parked = moves.to_manual_review(failed, codes.INVALID_RETRY_POLICY, reason, now)
            return moves.one_write(s, parked)

        return review
    return lambda s: moves.compensation_failed(s, name, effect, attempt, now + delay, now)


def execute_compensation(
    engine: Engine, saga_id: str, name: str, effect_id: str, body: CompensationBody
) -> None:
    """Handle one delivery of a compensator task whose task id is ``effect_id``."""
    tag = claim_tag()
    with engine.active.running(tag):
        claimed = _claim_compensation(engine, saga_id, name, effect_id, tag)
        if claimed is None:
            return
        step = _step(claimed, name)
        ctx = StepContext(saga_id, name, effect_id, step.compensation_attempts, Stage.COMPENSATION)
        started = time.monotonic()
        error = False
        try:
            body(ctx, step.args, step.kwargs, step.result)
        except Exception as exc:
            logger.warning("saga %s compensator of %s raised %s", saga_id, name, type(exc).__name__)
            error = True

        def announce(written: SagaRecord) -> None:
            phase = Phase.FAILED if error else Phase.COMMITTED
            code = codes.COMPENSATION_FAILED if error else None
            duration = int((time.monotonic() - started) * 1000)
            engine.emit(written, _step(written, name), Stage.COMPENSATION, phase, code, duration)

        move = _backward_move(engine, claimed, step, error)
        written = _settle(engine, claimed, move, announce, merge=True)
    if written is not None:
        engine.advance(saga_id, written)
