"""One delivery of a step or compensator task: claim, run the body, record the outcome (docs/design.md §3.2).

The claim appends a claim note to the saga record at the version the message names (or a
newer one this process wrote): one round trip, no read. A duplicate that finds the version
moved on reads the record and judges it: the attempt may be running elsewhere (do nothing),
may have vanished (settle it as the protocol says: ambiguous, or retried when idempotent), or
may still be claimable (claim on the version read). After the body, the outcome is written
with one compare-and-set merged with the saga's next decision, so the next step's intent costs
no extra round trip and its message goes out from this process.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from . import _values as values
from ._announcer import Announcer
from ._clock import Clock, now_ms
from ._context import CompensationReason, StepContext
from ._definitions import Backoff, Registry, StepOptions
from ._engine import Engine, EngineSettings
from ._events import Phase, Stage
from ._frozen import replace
from ._inline import InlineRunner, holding, take_claim
from ._liveness import claim_tag, dead_effects
from ._planner import Planner
from ._protocol import codes, moves
from ._protocol.compensation import (
    check_backoff,
    default_backoff_ms,
    full_jitter_ms,
    rollback_reason,
)
from ._protocol.decide import judge_in_flight
from ._protocol.decisions import Vanished
from ._protocol.notes import ClaimNote
from ._records import AttemptRef, SagaRecord, SagaState, StepRecord, StepState
from ._repository import Plan, SagaRepository, unanswered
from .errors import (
    IllegalTransition,
    SagaNotFound,
    SagaValidationError,
    StepNotCommitted,
    StepTimeLimitExceeded,
    StoreError,
    UndecryptableRecord,
)

__all__ = ["Delivery", "DeliveryParts"]

logger = logging.getLogger("celery_sagas.execution")

StepBody = Callable[[StepContext, tuple[Any, ...], Mapping[str, Any]], Any]
CompensationBody = Callable[[StepContext, tuple[Any, ...], Mapping[str, Any], Any], Any]
Move = Callable[[SagaRecord], SagaRecord]

_INLINE_RETRY_MAX_MS = 5_000
_STORE_PAUSE_S = 0.5  # the first wait for a store that did not answer a claim
_STORE_PAUSE_MAX_S = 5.0
_STORE_WAIT_SHARE = 0.8  # of the time limit a claim waits for a silent store, at most
_BEGIN_SHARE = 0.5  # past this share of its time limit, a delivery that waited begins no body


class _Kind(Enum):
    """What a body did: returned a result, raised a known failure, raised a ``retry_on`` type
    (nothing committed, worth another try), or raised anything else."""

    COMMITTED = "committed"
    FAILED = "failed"
    TRANSIENT = "transient"
    ERRORED = "errored"  # the outcome is unknown unless the step may be retried

    @property
    def phase(self) -> Phase:
        """The lifecycle phase an outcome of this kind is announced as."""
        return _PHASES[self]


_PHASES = {_Kind.COMMITTED: Phase.COMMITTED, _Kind.FAILED: Phase.FAILED,
           _Kind.TRANSIENT: Phase.FAILED, _Kind.ERRORED: Phase.AMBIGUOUS}


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What a body did, with its result or error code (and what it raised, as text)."""

    kind: _Kind
    result: Any = None
    error_code: str | None = None
    exception: str | None = None
    traceback: str | None = None

    @classmethod
    def raised(cls, kind: _Kind, error_code: str, exc: BaseException) -> _Outcome:
        """A body that raised ``exc``: its text and where it was raised."""
        return cls(kind, error_code=error_code, exception=values.exception_text(exc),
                   traceback=values.traceback_text(exc))


@dataclass(frozen=True, slots=True)
class DeliveryParts:
    """What every delivery of one runtime works with, built once beside its engine
    (``_celery/wiring.Runtime``)."""

    repository: SagaRepository
    planner: Planner
    announcer: Announcer
    registry: Registry
    settings: EngineSettings
    clock: Clock
    draw: Callable[[], float]  # a fraction in [0, 1): the jitter of default backoffs
    advance: Callable[[str, SagaRecord], SagaRecord]  # drive a saga on (``Engine.advance``)

    @classmethod
    def of(cls, engine: Engine) -> DeliveryParts:
        """The parts of deliveries beside ``engine``."""
        return cls(engine.repository, engine.planner, engine.announcer, engine.registry,
                   engine.settings, engine.clock, engine.draw, engine.advance)


class Delivery:
    """One delivery of the task whose task id is ``effect_id`` (a step's or its compensator's)."""

    def __init__(self, parts: DeliveryParts, saga_id: str, step: str, effect_id: str,
                 version: int | None, *, compensation: bool,
                 inline: InlineRunner | None = None, time_limit_ms: int | None = None) -> None:
        self.repository = parts.repository
        self.planner = parts.planner
        self.announcer = parts.announcer
        self.registry = parts.registry
        self.settings = parts.settings
        self.clock = parts.clock
        self.draw = parts.draw
        self.advance = parts.advance
        self.saga_id = saga_id
        self.step = step
        self.effect_id = effect_id
        self.version = version
        self.compensation = compensation
        self.stage = Stage.COMPENSATION if compensation else Stage.EXECUTION
        # Runs the next step here when its saga continues inline (docs/design.md §3.2).
        self.inline = inline
        # The step this delivery's settle claimed to run here: its record, step, claim tag,
        # and the settle's effects when they wait until its body ran (see _record_outcome).
        self._next: tuple[SagaRecord, StepRecord, str, Callable[[], None] | None] | None = None
        # The task's hard time limit (None: as far as the record or the settings say), counted
        # from here: a delivery that waited long for its store must leave the body time to run.
        self.time_limit_ms = time_limit_ms
        self._began = time.monotonic()
        self._waited_for_store = False

    def _now(self) -> int:
        return now_ms(self.clock)

    # ------------------------------------------------------------ the two kinds of body

    def run_step(self, body: StepBody) -> None:
        """Claim, run and record a step; a retry due soon runs again here (no broker hop)."""
        handed = take_claim(self.effect_id)
        tag = handed[1] if handed is not None else claim_tag()
        written = None
        claimed = self._announced(handed[0]) if handed is not None else self.claim(tag)
        while claimed is not None:
            written = self._attempt(claimed, body)
            delay = None if written is None else self._inline_retry_delay(written)
            if delay is None:
                break
            time.sleep(delay / 1000)
            claimed = self.claim(tag, retrying=True)
        self._after_settle(written)

    def run_compensation(self, body: CompensationBody) -> None:
        """Claim, run and record one compensator call."""
        tag = claim_tag()
        written = None
        claimed = self.claim(tag)
        if claimed is not None:
            written = self._compensate(claimed, body)
        self._after_settle(written)

    def _after_settle(self, written: SagaRecord | None) -> None:
        """Drive the saga on after this delivery's outcome was written: run the step its settle
        claimed here, or else replay ``run`` for what follows (unless the settle already
        recorded all that can follow: steps sent, or the saga settled)."""
        if written is None:
            return
        if self._next is not None:
            claimed, step, tag, deferred = self._next
            self._next = None
            assert self.inline is not None
            with holding(step.effect_id, claimed, tag):
                try:
                    self.inline.run(claimed, step)
                finally:
                    if deferred is not None:
                        deferred()
            return
        if not _nothing_follows(written) or written.parent is not None:
            self.advance(self.saga_id, written)

    # ------------------------------------------------------------ claim

    def claim(self, tag: str, *, retrying: bool = False) -> SagaRecord | None:
        """Claim the start of this delivery's attempt; the claimed record, or None when this
        delivery must not run its body.

        A claim the store did not answer may or may not have been written: the delivery waits
        for the store and claims again through ``_judge``, which takes back a claim of its own
        it finds (its body never began) before claiming afresh. A record no configured key
        opens is never left claimed (``_undecryptable``).
        """
        blind, deadline, pause = not retrying, None, _STORE_PAUSE_S
        while True:
            try:
                return self._claim(tag, retrying=retrying, blind=blind)
            except UndecryptableRecord:
                self._undecryptable()
                return None
            except StoreError as exc:
                if not unanswered(exc):
                    raise
                deadline = deadline or self._store_wait_deadline()
                if time.monotonic() >= deadline:
                    raise
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            blind, pause = False, min(pause * 2, _STORE_PAUSE_MAX_S)

    def _claim(self, tag: str, *, retrying: bool, blind: bool) -> SagaRecord | None:
        """One claim: blindly at the version this process knows (``blind``), else by reading
        the record and judging it."""
        expected = self._blind_version() if blind else None
        if expected is not None:
            note = self._claim_note(tag)
            claimed = self.repository.note(self.saga_id, note, expected,
                                           take_back_unreadable=True)
            if claimed is not None and self._claimed_by(claimed, tag):
                return self._announced(claimed)
        # a vanished attempt settled for a retry, or our own claim taken back, then the claim
        for _ in range(3):
            try:
                record, plan = self.repository.update(
                    self.saga_id, lambda s: self._judge(s, tag, retrying))
            except SagaNotFound:
                logger.warning("saga %s: no such record; message dropped", self.saga_id)
                return None
            if plan is None:
                if not self.compensation and record.rolling_back and record.state is SagaState.RUNNING:
                    self.advance(self.saga_id, record)
                return None
            plan.run_effects(record)
            if plan.note is not None:
                return self._announced(record) if self._claimed_by(record, tag) else None
        return None

    def _store_wait_deadline(self) -> float:
        """When to stop waiting for a store that did not answer a claim: before the task's
        hard time limit kills the process (a written claim of a killed process would read as
        ``worker_lost``)."""
        logger.warning("saga %s step %s: the store did not answer the claim; waiting for it",
                       self.saga_id, values.printable(self.step))
        self._waited_for_store = True
        return self._began + self._time_limit_ms() * _STORE_WAIT_SHARE / 1000

    def _too_late_to_begin(self) -> bool:
        """Whether this delivery waited so long for its store that a body begun now could
        outlast the task's hard time limit: then it claims nothing, and the step (its claim
        taken back) is sent again by the sweep, to a delivery with the whole limit."""
        if not self._waited_for_store:
            return False
        spent_ms = (time.monotonic() - self._began) * 1000
        return spent_ms > self._time_limit_ms() * _BEGIN_SHARE

    def _time_limit_ms(self) -> int:
        """The task's hard time limit, else the step's as far as this process knows it."""
        if self.time_limit_ms:
            return self.time_limit_ms
        known = self.repository.known(self.saga_id)
        step = None if known is None else known.step(self.step)
        if step is not None and not self.compensation and step.time_limit_ms:
            return step.time_limit_ms
        return self.settings.timing.default_time_limit_ms

    def _undecryptable(self) -> None:
        """No configured key opens the saga's payloads: the body cannot run here, and no claim
        is left behind (``SagaRepository.note`` took it back), so nothing is ambiguous; the
        sweep reports the record as ``undecryptable`` and re-sends the step once it is stale,
        for a worker holding the key."""
        logger.error("saga %s step %s: undecryptable: no configured encryption key opens its "
                     "payloads; not claimed, message dropped (the sweep re-sends it)",
                     self.saga_id, values.printable(self.step))

    def _claim_note(self, tag: str) -> str:
        return ClaimNote(self.step, self.effect_id, tag, self._now()).text()

    def _blind_version(self) -> int | None:
        """The version to claim on without reading: the message's (its intent was written at
        it), or a newer one this process wrote if that record shows the step claimable."""
        known = self.repository.known(self.saga_id)
        if known is None or (self.version is not None and known.version < self.version):
            return self.version
        return known.version if self._claimable(known, retrying=False) else None

    def _claimed_by(self, saga: SagaRecord, tag: str) -> bool:
        """Whether ``saga`` shows this delivery's attempt claimed by ``tag``."""
        step = saga.step(self.step)
        return step is not None and step.claimed_by == tag and step.started_at_ms is not None \
            and self.effect_id == (step.compensation_effect_id if self.compensation else step.effect_id)

    def _announced(self, claimed: SagaRecord) -> SagaRecord:
        self.announcer.emit(claimed, self._step_of(claimed), self.stage, Phase.EXECUTING)
        return claimed

    def _ours(self, saga: SagaRecord) -> StepRecord | None:
        """The step this delivery is for, if the saga still names this effect for it."""
        step = saga.step(self.step)
        if step is None:
            return None
        expected = step.compensation_effect_id if self.compensation else step.effect_id
        return step if expected == self.effect_id else None

    def _claimable(self, saga: SagaRecord, *, retrying: bool) -> bool:
        """Whether this delivery may claim its attempt on ``saga`` now."""
        step = self._ours(saga)
        if step is None or not self._live(saga, step) or step.started_at_ms is not None:
            return False
        due = step.next_attempt_at_ms
        return retrying or due is None or self._now() >= due

    def _judge(self, saga: SagaRecord, tag: str, retrying: bool) -> Plan | None:
        """What a delivery that could not claim blindly does with the record it read: its own
        claim (a lost reply) is taken back first, then a started attempt is judged, then it
        claims if it may."""
        step = self._ours(saga)
        if step is None:
            logger.warning("saga %s step %s: message for another effect or saga dropped",
                           self.saga_id, values.printable(self.step))
            return None
        if self._claimed_by(saga, tag):
            return self._withdrawal(saga, step, tag)
        if self._live(saga, step) and step.started_at_ms is not None:
            return self._vanished(saga, step)
        if not self._claimable(saga, retrying=retrying):
            return None
        if self._too_late_to_begin():
            logger.warning("saga %s step %s: the store answered too late in this delivery to "
                           "begin the body; not claimed, the sweep sends the step again",
                           self.saga_id, values.printable(self.step))
            return None
        return Plan(note=self._claim_note(tag))

    def _withdrawal(self, saga: SagaRecord, step: StepRecord, tag: str) -> Plan | None:
        """Take back this delivery's own claim, written though its reply was lost: the body
        never began, so the step is as if never claimed and is claimed again afresh (a new
        start time: the time limit counts from the body's real start)."""
        ref = AttemptRef.compensation(step) if self.compensation else AttemptRef.execution(step)
        try:
            after = moves.withdraw_claim(saga, ref, tag, self._now())
        except IllegalTransition:
            return None
        logger.info("saga %s step %s: own claim found after a lost reply; taken back",
                    self.saga_id, values.printable(self.step))
        return Plan(after=after)

    def _live(self, saga: SagaRecord, step: StepRecord) -> bool:
        """Whether the step is in the state this kind of delivery runs in."""
        if self.compensation:
            return step.state is StepState.COMPENSATING and saga.state is SagaState.COMPENSATING
        return (step.state is StepState.EXECUTING and saga.state is SagaState.RUNNING
                and not saga.rolling_back)

    def _vanished(self, saga: SagaRecord, step: StepRecord) -> Plan | None:
        """A started attempt found by a new delivery: settle it if its claimer is gone."""
        policy = self.registry.policy(self.registry.definition(saga.definition),
                                      self.settings.timing)
        verdict = judge_in_flight(step, self._now(), policy, dead_effects(saga.steps),
                                  rolling_back=saga.rolling_back)
        if not isinstance(verdict, Vanished):
            logger.info("saga %s step %s: attempt still running elsewhere", self.saga_id, self.step)
            return None
        plan = self.planner.vanished(saga, verdict, self._now())
        if verdict.retry and not verdict.compensation:
            return plan  # the caller claims the retry next

        def advance(written: SagaRecord) -> None:
            self.advance(written.saga_id, written)

        return Plan(after=plan.after, then=(*plan.then, advance))

    # ------------------------------------------------------------ outcomes

    def _step_of(self, saga: SagaRecord) -> StepRecord:
        step = saga.step(self.step)
        assert step is not None
        return step

    def _record_outcome(self, claimed: SagaRecord, move: Move, announce: Callable[[SagaRecord], None],
                *, merge: bool, oversized: tuple[Move, Callable[[SagaRecord], None]] | None = None
                ) -> SagaRecord | None:
        """Write an outcome (merged with what follows when ``merge``; ``oversized`` when the
        outcome itself is over the payload limit); None when the saga moved on so that this
        outcome no longer applies."""
        inline_tag = claim_tag()

        def decide(saga: SagaRecord) -> Plan:
            too_large = None
            if oversized is not None:
                too_large = lambda: Plan(after=oversized[0](saga), then=(oversized[1],))  # noqa: E731
            moved = move(saga)
            if merge:
                return self._claim_next(moved, self.planner.continued(moved, announce, too_large),
                                        inline_tag)
            return Plan(after=moved, then=(announce,), too_large=too_large)

        try:
            written, plan = self.repository.update(self.saga_id, decide, known=claimed,
                                                   wait_for_store=True)
        except IllegalTransition:
            logger.warning("saga %s moved on; outcome of %s not recorded here", self.saga_id, self.step)
            return None
        assert plan is not None
        step = _claimed_here(written, inline_tag)
        if step is None:
            plan.run_effects(written)
            return written
        if _appended(claimed, written) == [step.name]:
            # Its body starts before anything else runs: a crash between the write and the
            # body is as unlikely as between a sent step's claim and its body.
            self._next = (written, step, inline_tag, lambda: plan.run_effects(written))
            return written
        with holding(step.effect_id, written, inline_tag):
            plan.run_effects(written)  # every effect but sending the step this process runs
        self._next = (written, step, inline_tag, None)
        return written

    def _claim_next(self, moved: SagaRecord, plan: Plan, tag: str) -> Plan:
        """``plan`` with the first step it appends claimed for this process (under ``tag``)
        when that step may run inline here: the settle is also the next step's claim."""
        after = plan.after
        if self.inline is None or self.compensation or after is None:
            return plan
        known = {s.name for s in moved.steps}
        fresh = [s for s in after.steps if s.name not in known]
        if not fresh or fresh[0].state is not StepState.EXECUTING:
            return plan
        step = fresh[0]
        if not self._inline_allowed(after, step) or not self.inline.eligible(after, step):
            return plan
        claimed = moves.claim_step(after, step.name, step.effect_id, tag, self._now())
        return replace(plan, after=replace(claimed, version=after.version))

    def _inline_allowed(self, saga: SagaRecord, step: StepRecord) -> bool:
        """The saga's choice (or ``sagas_inline_steps``) and the step's (``inline=False``)."""
        registry = self.registry
        definition = registry.definition(saga.definition)
        chosen = definition.inline if definition.inline is not None else self.settings.inline
        return chosen and registry.step(step.task).inline

    # ------------------------------------------------------------ forward

    def _attempt(self, claimed: SagaRecord, body: StepBody) -> SagaRecord | None:
        """Run the body once and record its outcome; None when it could not be recorded."""
        step = self._step_of(claimed)
        options = self.registry.step(step.task)
        ctx = StepContext(claimed.saga_id, step.name, self.effect_id, step.attempts, self.stage)
        started = time.monotonic()
        outcome = _run_step_body(body, ctx, step, options)

        def announcer(kind: _Kind, code: str | None) -> Callable[[SagaRecord], None]:
            def announce(written: SagaRecord) -> None:
                after = self._step_of(written)
                phase = kind.phase if after.state is not StepState.EXECUTING else Phase.FAILED
                duration = int((time.monotonic() - started) * 1000)
                self.announcer.emit(written, after, Stage.EXECUTION, phase, code, duration)
            return announce

        oversized = _Outcome(_Kind.ERRORED, error_code=codes.PAYLOAD_TOO_LARGE)
        # A retry stays in this delivery, so only a final outcome is merged with what follows.
        return self._record_outcome(
            claimed, self._forward_move(options, step, outcome),
            announcer(outcome.kind, outcome.error_code), merge=outcome.kind is not _Kind.ERRORED,
            oversized=(self._forward_move(options, step, oversized),
                       announcer(oversized.kind, oversized.error_code)),
        )

    def _forward_move(self, options: StepOptions, step: StepRecord, outcome: _Outcome) -> Move:
        move = self._forward_only(options, step, outcome)
        return lambda s: moves.with_exception(move(s), step.name, outcome.exception,
                                              outcome.traceback)

    def _forward_only(self, options: StepOptions, step: StepRecord, outcome: _Outcome) -> Move:
        ref, now = AttemptRef.execution(step), self._now()
        if outcome.kind is _Kind.COMMITTED:
            return lambda s: moves.commit_step(s, ref, outcome.result, now)
        code = outcome.error_code or codes.STEP_ERROR
        failed: Move = lambda s: moves.fail_step(s, ref, code, now, catchable=True)  # noqa: E731
        if outcome.kind is _Kind.FAILED:
            return failed
        transient = outcome.kind is _Kind.TRANSIENT
        declared = options.compensate_unknown
        unknown: Move = failed if transient else (
            lambda s: moves.step_ambiguous(s, ref, code, now, compensate=declared))
        if step.attempts >= options.attempts_per_effect or not (transient or options.idempotent):
            return unknown
        delay = self._retry_delay(options.backoff, step.attempts)
        if delay is None:
            # No retry can be scheduled: the outcome stays unknown, under its own code.
            return failed if transient else (lambda s: moves.step_ambiguous(
                s, ref, codes.INVALID_RETRY_POLICY, now, compensate=declared))
        retry_at = now + delay

        def release(s: SagaRecord) -> SagaRecord:
            # No retry is claimed while the saga rolls back (the reload of a lost race may see it).
            if s.rolling_back:
                return unknown(s)
            return moves.release_step(s, ref, retry_at, code, now)

        return release

    def _inline_retry_delay(self, saga: SagaRecord) -> int | None:
        """A retry due soon is run in this delivery (no broker hop); later ones go to the sweep."""
        step = self._step_of(saga)
        due = step.next_attempt_at_ms
        if step.state is not StepState.EXECUTING or step.started_at_ms is not None or due is None:
            return None
        delay = max(0, due - self._now())
        return delay if delay <= _INLINE_RETRY_MAX_MS else None

    # ------------------------------------------------------------ backward

    def _compensate(self, claimed: SagaRecord, body: CompensationBody) -> SagaRecord | None:
        step = self._step_of(claimed)
        ctx = _compensation_context(claimed, step, self.effect_id)
        started = time.monotonic()
        exception = frames = None
        try:
            body(ctx, step.args, step.kwargs, step.result)
        except Exception as exc:
            logger.error("saga %s compensator of %s raised %s", self.saga_id, step.name,
                         type(exc).__name__, exc_info=True)
            exception, frames = values.exception_text(exc), values.traceback_text(exc)
        error = exception is not None

        def announce(written: SagaRecord) -> None:
            phase = Phase.FAILED if error else Phase.COMMITTED
            code = codes.COMPENSATION_FAILED if error else None
            duration = int((time.monotonic() - started) * 1000)
            self.announcer.emit(written, self._step_of(written), Stage.COMPENSATION, phase, code,
                                duration)

        move = self._backward_move(claimed, step, error)
        return self._record_outcome(
            claimed, lambda s: moves.with_exception(move(s), step.name, exception, frames),
            announce,
            merge=True,
        )

    def _backward_move(self, saga: SagaRecord, step: StepRecord, error: bool) -> Move:
        ref, now = AttemptRef.compensation(step), self._now()
        if not error:
            return lambda s: moves.compensation_succeeded(s, ref, now)
        backoff: Backoff = self.registry.definition(saga.definition).backoff
        delay = self._retry_delay(backoff, step.compensation_attempts)
        if delay is None:
            reason = f"backoff of saga {saga.definition!r} returned an invalid delay"

            def review(s: SagaRecord) -> SagaRecord:
                failed = moves.compensation_failed(s, ref, now, now)
                parked = moves.to_manual_review(failed, codes.INVALID_RETRY_POLICY, reason, now)
                return moves.one_write(s, parked)

            return review
        return lambda s: moves.compensation_failed(s, ref, now + delay, now)

    def _retry_delay(self, backoff: Backoff, attempt: int) -> int | None:
        """The delay before the next attempt (None: the backoff returned nothing valid). The
        default backoff gets full jitter, drawn once here: the move that stores the retry time
        reuses it on every compare-and-set retry, and replays and sweeps read it back."""
        delay = check_backoff(_safe_backoff(backoff, attempt, self.saga_id))
        if delay is not None and backoff is default_backoff_ms:
            delay = full_jitter_ms(delay, self.draw())
        return delay


def _compensation_context(saga: SagaRecord, step: StepRecord, effect_id: str) -> StepContext:
    """What a compensator's ``saga`` keyword holds: its attempt, and what it undoes and why."""
    step_name, code = rollback_reason(saga)
    return StepContext(saga.saga_id, step.name, effect_id, step.compensation_attempts,
                       Stage.COMPENSATION, input=saga.input, forward_effect_id=step.effect_id,
                       reason=CompensationReason(code, step_name),
                       outcome="unknown" if step.outcome_unknown else "committed")


def _error_code(exc: BaseException, default: str) -> str:
    """StepNotCommitted's code, or the exception's class in snake case (CardDeclined →
    card_declined, HTTPError → http_error)."""
    code = exc.code if isinstance(exc, StepNotCommitted) else snake_case(type(exc).__name__)
    try:
        return values.error_code(code) if code is not None else default
    except SagaValidationError:
        return default


def snake_case(name: str) -> str:
    """A class name as a readable code: a capital starts a word unless it continues an acronym
    (``HTTPError`` → ``http_error``, ``OAuth2Error`` → ``o_auth2_error``)."""
    return _WORD_START.sub("_", name).lower()


_WORD_START = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def _run_step_body(body: StepBody, ctx: StepContext, step: StepRecord, options: StepOptions) -> _Outcome:
    known: tuple[type[BaseException], ...] = (StepNotCommitted, *options.not_committed_on)
    try:
        result = body(ctx, step.args, step.kwargs)
    except options.retry_on as exc:  # checked first: the step asked for these to be retried
        logger.info("saga %s step %s did not commit, retryable: %s", ctx.saga_id, ctx.step,
                    type(exc).__name__)
        return _Outcome.raised(_Kind.TRANSIENT, _error_code(exc, codes.NOT_COMMITTED), exc)
    except known as exc:
        logger.info("saga %s step %s did not commit: %s", ctx.saga_id, ctx.step, type(exc).__name__)
        return _Outcome.raised(_Kind.FAILED, _error_code(exc, codes.NOT_COMMITTED), exc)
    except StepTimeLimitExceeded as exc:
        logger.error("saga %s step %s ran past its time limit", ctx.saga_id, ctx.step)
        return _Outcome.raised(_Kind.ERRORED, codes.TIME_LIMIT, exc)
    except Exception as exc:
        logger.error("saga %s step %s raised %s", ctx.saga_id, ctx.step, type(exc).__name__,
                     exc_info=True)
        return _Outcome.raised(_Kind.ERRORED, codes.STEP_ERROR, exc)
    try:
        return _Outcome(_Kind.COMMITTED, result=values.json_value(result, field="step result"))
    except SagaValidationError:
        # Never the result itself, nor the path into it: logs carry no payloads.
        logger.error("saga %s step %s: invalid_result: it returned a value JSON cannot carry",
                     ctx.saga_id, ctx.step)
        return _Outcome(_Kind.ERRORED, error_code=codes.INVALID_RESULT)


def _safe_backoff(backoff: Callable[[int], int], attempt: int, saga_id: str) -> object:
    """``backoff(attempt)``, or None (logged) when it raises: the policy is invalid."""
    try:
        delay = backoff(attempt)
    except Exception as exc:
        logger.error("saga %s: invalid_retry_policy: %s", saga_id, exc)
        return None
    if check_backoff(delay) is None:
        logger.error("saga %s: invalid_retry_policy: backoff(%d) returned an invalid delay",
                     saga_id, attempt)
    return delay


def _appended(before: SagaRecord, after: SagaRecord) -> list[str]:
    """The names of the steps ``after`` has that ``before`` had not."""
    known = {s.name for s in before.steps}
    return [s.name for s in after.steps if s.name not in known]


def _claimed_here(saga: SagaRecord, tag: str) -> StepRecord | None:
    """The step claimed under ``tag`` (by a settle that claimed the next step inline)."""
    return next((s for s in saga.steps if s.claimed_by == tag), None)


def _nothing_follows(saga: SagaRecord) -> bool:
    """Whether a replay of ``run`` would find nothing to do: the saga settled, or every step
    not yet done is sent and unclaimed or running (replay stops at it and waits). A saga
    rolling back is always driven on: its unclaimed steps are abandoned at once."""
    if saga.state is not SagaState.RUNNING:
        return saga.state is not SagaState.COMPENSATING
    if saga.rolling_back:
        return False
    states = [s.state for s in saga.steps]
    return StepState.EXECUTING in states and all(
        state in (StepState.COMMITTED, StepState.EXECUTING) for state in states)
