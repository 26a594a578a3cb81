"""The engine: load a saga, ask the protocol what to do, write it with one CAS, then dispatch.

No Celery here and no concrete store: the engine talks to the ``Store``, ``Dispatcher`` and
``Clock`` ports. Every write is a compare-and-set of the whole saga record; losing the race
raises ``SagaConcurrencyError`` internally, and the engine reloads and decides again instead
of overwriting. Work is dispatched only after the write that records its intent succeeded;
if the process dies between the two, the sweep finds the intent and sends it again under the
same effect id.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from . import _values as values
from ._approvals.gate import ApprovalGate
from ._clock import Clock, SystemClock, now_ms
from ._context import APPROVAL_TASK, replay
from ._definitions import Registry, SagaDefinition, Timing
from ._dispatch import Dispatcher
from ._events import EventBus, LifecycleEvent, Phase, Stage, effect_stage
from ._journal import EffectRecorder, unique_write
from ._liveness import PROCESS_ACTIVE, dead_effects
from ._protocol import codes, moves
from ._protocol.decide import decide
from ._protocol.decisions import (
    Abandon,
    Append,
    BeginCompensation,
    Complete,
    Decision,
    FinishCompensation,
    Redispatch,
    Review,
    StartCompensation,
    Vanished,
    Wait,
)
from ._protocol.resolution import resolve as resolve_outcome
from ._records import (
    SAGA,
    SagaRecord,
    SagaState,
    StepRecord,
    StepState,
    saga_from_envelope,
    saga_to_envelope,
)
from .errors import (
    IllegalTransition,
    PayloadTooLarge,
    SagaConcurrencyError,
    SagaConflictError,
    SagaNotFound,
    SagaResolutionError,
)
from .stores.base import Fence, Store

__all__ = ["Engine", "EngineSettings"]

logger = logging.getLogger("celery_sagas.engine")

_WRITE_ID_ROOM = 64  # bytes the write id adds beyond the payload limit

EXECUTE_CAPABILITY = "saga.execute"
COMPENSATE_CAPABILITY = "saga.compensate"


def _new_effect_id() -> str:
    return str(uuid.uuid4())


class RecentSagas:
    """A small, thread-safe LRU of saga records this process last saw (small records only)."""

    def __init__(self, capacity: int = 512, max_body: int = 64 * 1024) -> None:
        self._lock = threading.Lock()
        self._records: OrderedDict[str, SagaRecord] = OrderedDict()
        self._capacity = capacity
        self._max_body = max_body

    def remember(self, record: SagaRecord, body_size: int) -> None:
        """Keep ``record`` as the latest known version of its saga."""
        with self._lock:
            known = self._records.get(record.saga_id)
            if known is not None and known.version > record.version:
                return
            if body_size > self._max_body:
                self._records.pop(record.saga_id, None)
                return
            self._records[record.saga_id] = record
            self._records.move_to_end(record.saga_id)
            while len(self._records) > self._capacity:
                self._records.popitem(last=False)

    def forget(self, saga_id: str) -> None:
        """Drop a saga known to have changed elsewhere."""
        with self._lock:
            self._records.pop(saga_id, None)

    def get(self, saga_id: str) -> SagaRecord | None:
        """The last version seen, which may be stale."""
        with self._lock:
            return self._records.get(saga_id)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Limits the engine applies (sizes in bytes, durations in ms)."""

    payload_limit: int = values.DEFAULT_PAYLOAD_LIMIT
    timing: Timing = field(default_factory=Timing)
    max_races: int = 64


class Engine:
    """Drives sagas over a store; every public method validates before it writes."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        dispatcher: Dispatcher,
        *,
        clock: Clock | None = None,
        events: EventBus | None = None,
        new_id: Callable[[], str] = _new_effect_id,
        settings: EngineSettings | None = None,
        journal: EffectRecorder | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.dispatcher = dispatcher
        self.clock: Clock = clock or SystemClock()
        self.events = events or EventBus()
        self.new_id = new_id
        self.settings = settings or EngineSettings()
        self.active = PROCESS_ACTIVE
        # The last version of each saga this process read or wrote: a claim may try its
        # compare-and-set on it without reading first (a stale guess just loses the CAS).
        self.recent = RecentSagas()
        # Journals every step execution and compensation as an effect record (SPEC §2.1).
        self.journal = journal
        self.approvals: ApprovalGate | None = None
        # Set when approvals are configured: aligns gate steps with their approval records.
        self.reconcile_gates: Callable[[SagaRecord, Fence | None], SagaRecord] | None = None

    # ------------------------------------------------------------ records

    def now(self) -> int:
        """The current time in ms, validated."""
        return now_ms(self.clock)

    def get(self, saga_id: str) -> SagaRecord | None:
        """The saga record, or None when absent."""
        values.saga_id(saga_id)
        envelope = self.store.get(SAGA, saga_id)
        if envelope is None:
            return None
        record = saga_from_envelope(envelope, saga_id)
        self.recent.remember(record, len(envelope.body))
        return record

    def load(self, saga_id: str) -> SagaRecord:
        """The saga record; SagaNotFound when absent."""
        record = self.get(saga_id)
        if record is None:
            raise SagaNotFound(saga_id=saga_id)
        return record

    def write(self, before: SagaRecord, after: SagaRecord, fence: Fence | None = None) -> SagaRecord:
        """Store ``after`` if the record is still at ``before.version`` (and the fence holds)."""
        limit = self.settings.payload_limit
        # Unique per call: two racers that computed the same next record (same move, same
        # millisecond) must not both be told they won (the store takes an identical stored
        # record for an already-applied retry of this very call).
        envelope = unique_write(saga_to_envelope(after, limit=limit), limit=limit + _WRITE_ID_ROOM)
        if not self.store.compare_and_set(envelope, before.version, fence=fence):
            self.recent.forget(before.saga_id)
            raise SagaConcurrencyError(f"saga {before.saga_id!r} changed under us")
        self.recent.remember(after, len(envelope.body))
        return after

    def definition_of(self, saga: SagaRecord) -> SagaDefinition:
        """The definition a saga was started with (must be registered in this process)."""
        return self.registry.definition(saga.definition)

    # ------------------------------------------------------------ start

    def start(self, definition: str, input: Any, saga_id: str) -> SagaRecord:
        """Create the saga (idempotent for the same input) and ask a worker to advance it."""
        values.saga_id(saga_id)
        self.registry.definition(definition)
        canonical = values.encode_json(input, field="saga input", limit=self.settings.payload_limit)
        now = self.now()
        record = SagaRecord(
            saga_id, definition, SagaState.RUNNING, values.decode_json(canonical), now, now
        )
        if self.store.create(saga_to_envelope(record, limit=self.settings.payload_limit)):
            self._send_advance(saga_id)
            return record
        existing = self.load(saga_id)
        same_input = values.encode_json(existing.input, limit=2**53) == canonical
        if existing.definition != definition or not same_input:
            raise SagaConflictError(saga_id=saga_id)
        if existing.state is SagaState.RUNNING and not existing.steps:
            self._send_advance(saga_id)
        return existing

    # ------------------------------------------------------------ advance

    def advance(
        self, saga_id: str, known: SagaRecord | None = None, fence: Fence | None = None
    ) -> SagaRecord:
        """Apply decisions until the saga must wait for something outside this process."""
        saga = known if known is not None else self.load(saga_id)
        for _ in range(self.settings.max_races + 4 * len(saga.steps) + 8):
            decision = self.decide(saga)
            if isinstance(decision, Wait):
                return saga
            try:
                saga = self.apply(saga, decision, fence)
            except SagaConcurrencyError:
                saga = self.load(saga_id)
        logger.warning("saga %s: stopped advancing after many decisions", saga_id)
        return saga

    def decide(self, saga: SagaRecord) -> Decision:
        """The protocol's next decision for this record, now."""
        if saga.state.final or saga.state is SagaState.MANUAL_REVIEW:
            return Wait()
        definition = self.definition_of(saga)
        policy = self.registry.policy(definition, self.settings.timing)
        now = self.now()

        def run_replay() -> Any:
            return replay(definition, saga, self.registry, self.new_id, now, self.settings.payload_limit)

        return decide(saga, run_replay, now, policy, dead_effects(saga.steps, self.active))

    def apply(
        self,
        saga: SagaRecord,
        decision: Decision,
        fence: Fence | None = None,
        *,
        prior: SagaRecord | None = None,
        on_written: Callable[[SagaRecord], None] | None = None,
    ) -> SagaRecord:
        """Carry out one decision: one CAS, then the events and dispatches it calls for.

        With ``prior``, ``saga`` is a move of ``prior`` not yet written: both go in one write
        (a step's commit and the next step's intent cost one round trip, not two), and
        ``on_written`` runs right after it, before this decision's own effects.
        """
        base = prior if prior is not None else saga
        after, effects = self._plan(saga, decision, self.now())
        try:
            written = self.write(base, after if prior is None else moves.one_write(prior, after), fence)
        except PayloadTooLarge:
            if not isinstance(decision, Append):
                raise
            reason = "the arguments of the next step would exceed the payload limit"
            parked = moves.to_manual_review(saga, codes.PAYLOAD_TOO_LARGE, reason, self.now())
            written = self.write(base, parked if prior is None else moves.one_write(prior, parked), fence)
            effects = []
        if on_written is not None:
            on_written(written)
        for effect in effects:
            effect(written)
        return written

    def _plan(self, saga: SagaRecord, decision: Decision, now: int
              ) -> tuple[SagaRecord, list[Callable[[SagaRecord], None]]]:
        """The record a decision writes and what to do once it is written."""
        if isinstance(decision, Append):
            return self._plan_append(saga, decision, now)
        if isinstance(decision, Redispatch):
            send = self.dispatcher.send_compensation if decision.compensation else self.dispatcher.send_step
            after = moves.mark_redispatched(saga, decision.step.name, now)
            return after, [lambda _: self._send(partial(send, saga.saga_id, decision.step))]
        if isinstance(decision, BeginCompensation):
            name = decision.step.name
            return moves.begin_compensation(saga, name, now), [partial(self._compensate, name)]
        if isinstance(decision, Vanished):
            return self._plan_vanished(saga, decision, now)
        after = self._saga_move(saga, decision, now)
        if isinstance(decision, Abandon):
            step = decision.step
            return after, [lambda w: self.emit(w, step, Stage.EXECUTION, Phase.FAILED,
                                               codes.NOT_STARTED)]
        return after, []

    def _plan_append(self, saga: SagaRecord, decision: Append, now: int
                     ) -> tuple[SagaRecord, list[Callable[[SagaRecord], None]]]:
        if not self._open_gates(saga, decision.steps):
            reason = "ctx.approval needs approval secrets (sagas_approval_secrets)"
            return moves.to_manual_review(saga, codes.INVALID_STEP_CALL, reason, now), []

        def announce(written: SagaRecord) -> None:
            for step in decision.steps:
                self.emit(written, step, Stage.EXECUTION, Phase.INTENT)
                if step.state is StepState.EXECUTING:
                    self._send(partial(self.dispatcher.send_step, written.saga_id, step))

        return moves.append_steps(saga, decision.steps, now), [announce]

    def _compensate(self, name: str, written: SagaRecord) -> None:
        begun = written.step(name)
        assert begun is not None
        self.emit(written, begun, Stage.COMPENSATION, Phase.INTENT)
        self._send(partial(self.dispatcher.send_compensation, written.saga_id, begun))

    def settle(
        self, prior: SagaRecord, moved: SagaRecord, on_written: Callable[[SagaRecord], None]
    ) -> SagaRecord:
        """Write ``moved`` (one move of ``prior``) merged with the decision that follows it.

        Raises SagaConcurrencyError when ``prior`` is no longer current; nothing was written.
        """
        decision = self.decide(moved)
        if isinstance(decision, Wait):
            written = self.write(prior, moved)
            on_written(written)
            return written
        return self.apply(moved, decision, prior=prior, on_written=on_written)

    def _open_gates(self, saga: SagaRecord, steps: tuple[StepRecord, ...]) -> bool:
        """Create the pending approval of each new gate before its step is recorded."""
        gates = [s for s in steps if s.state is StepState.AWAITING_APPROVAL]
        if gates and self.approvals is None:
            return False
        for gate in gates:
            assert self.approvals is not None and gate.approval_id is not None
            binding = gate.kwargs
            self.approvals.open(
                effect_id=gate.effect_id, approval_id=gate.approval_id,
                capability=binding["capability"], tenant_id=binding["tenant_id"],
                principal_id=binding["principal_id"], target=binding.get("target"),
                digest=binding.get("digest"), saga_id=saga.saga_id, step=gate.name,
            )
        return True

    def _saga_move(self, saga: SagaRecord, decision: Decision, now: int) -> SagaRecord:
        if isinstance(decision, Abandon):
            return moves.abandon_step(saga, decision.step.name, decision.step.effect_id, now)
        if isinstance(decision, Complete):
            return moves.complete(saga, now)
        if isinstance(decision, FinishCompensation):
            return moves.finish_compensation(saga, now)
        if isinstance(decision, StartCompensation):
            return moves.start_compensation(saga, decision.error_code, decision.reason, now)
        assert isinstance(decision, Review), decision
        logger.warning("saga %s needs manual review: %s", saga.saga_id, decision.error_code)
        return moves.to_manual_review(saga, decision.error_code, decision.reason, now)

    def _plan_vanished(self, saga: SagaRecord, decision: Vanished, now: int
                       ) -> tuple[SagaRecord, list[Callable[[SagaRecord], None]]]:
        step = decision.step
        if decision.compensation:
            effect, attempt = step.compensation_effect_id, step.compensation_attempts
            if decision.retry:
                after = moves.compensation_failed(saga, step.name, effect, attempt, now, now)
            else:
                after = moves.compensation_ambiguous(saga, step.name, effect, attempt, now)
            stage = Stage.COMPENSATION
        else:
            effect, attempt = step.effect_id, step.attempts
            if decision.retry:
                after = moves.release_step(
                    saga, step.name, effect, attempt, now, decision.error_code, now
                )
            else:
                after = moves.step_ambiguous(saga, step.name, effect, attempt, decision.error_code, now)
            stage = Stage.EXECUTION
        phase = Phase.FAILED if decision.retry else Phase.AMBIGUOUS
        return after, [lambda w: self.emit(w, step, stage, phase, decision.error_code)]

    # ------------------------------------------------------------ operator actions

    def cancel(self, saga_id: str) -> SagaRecord:
        """Stop forward progress and compensate what committed; a final saga is left as is."""

        def settled(saga: SagaRecord) -> bool:
            return saga.state.final or saga.state is SagaState.COMPENSATING

        return self._operator_move(saga_id, "cancel", moves.cancel, settled)

    def resume(self, saga_id: str) -> SagaRecord:
        """Lift manual review (once nothing is unresolved) and drive the saga on."""

        def not_in_review(saga: SagaRecord) -> bool:
            return saga.state is not SagaState.MANUAL_REVIEW

        return self._operator_move(saga_id, "resume", moves.resume, not_in_review)

    def _operator_move(
        self,
        saga_id: str,
        verb: str,
        move: Callable[[SagaRecord, int], SagaRecord],
        needless: Callable[[SagaRecord], bool],
    ) -> SagaRecord:
        """Apply an operator's move with a CAS (reloading on a lost race), then advance."""
        for _ in range(self.settings.max_races):
            saga = self.load(saga_id)
            if needless(saga):
                return saga if saga.state.final else self.advance(saga_id, saga)
            try:
                after = move(saga, self.now())
            except IllegalTransition as exc:
                raise SagaResolutionError(
                    f"saga {saga_id!r} has an unresolved step; resolve it first ({verb} refused)"
                ) from exc
            try:
                return self.advance(saga_id, self.write(saga, after))
            except SagaConcurrencyError:
                continue
        raise SagaConcurrencyError(f"saga {saga_id!r} kept changing; {verb} not applied")

    def resolve(
        self,
        saga_id: str,
        step: str,
        effect_id: str,
        outcome: str,
        *,
        result: Any = None,
        error_code: str | None = None,
    ) -> SagaRecord:
        """Record what an operator found out about an unknown outcome (no advance)."""
        values.step_name(step)
        values.effect_id(effect_id)
        normalised = values.json_value(result, field="result")
        saga = self.load(saga_id)
        max_attempts = self.definition_of(saga).max_attempts
        after = resolve_outcome(
            saga, step, effect_id, outcome, now_ms=self.now(), max_attempts=max_attempts,
            result=normalised, error_code=error_code,
        )
        written = self.write(saga, after)
        changed = written.step(step)
        assert changed is not None
        self.emit(written, changed, Stage.RECONCILIATION, _resolution_phase(str(outcome)), error_code)
        return written

    # ------------------------------------------------------------ helpers

    def emit(
        self, saga: SagaRecord, step: StepRecord, stage: str, phase: str,
        error_code: str | None = None, duration_ms: int | None = None,
    ) -> None:
        """Journal a step's effect transition, then publish it as a lifecycle event.

        ``saga`` is the record after the move (``step`` may be the step before it): the
        step's state there tells a final failure from one that will be retried, and which
        effect an operator's resolution settled.
        """
        current = saga.step(step.name) or step
        compensating = effect_stage(stage, current.state) == Stage.COMPENSATION
        event = LifecycleEvent(
            effect_id=step.compensation_effect_id if compensating else step.effect_id,
            capability=self._capability(saga, step, compensating),
            stage=stage,
            phase=phase,
            attempt=step.compensation_attempts if compensating else step.attempts,
            saga_id=saga.saga_id,
            definition=saga.definition,
            step=step.name,
            error_code=error_code,
            duration_ms=duration_ms,
        )
        # Approval gates are no side effect: their approval record is their journal.
        if self.journal is not None and step.task != APPROVAL_TASK:
            self.journal.record(event, current.state)
        self.events.emit(event)

    def _capability(self, saga: SagaRecord, step: StepRecord, compensating: bool) -> str:
        """Step (or compensator) option if set, else the definition's (steps only), else default."""
        if compensating:
            comp = self.registry.compensators.get(step.compensator or "")
            return comp.capability if comp else COMPENSATE_CAPABILITY
        options = self.registry.steps.get(step.task)
        if options is not None and options.capability != EXECUTE_CAPABILITY:
            return options.capability
        definition = self.registry.definitions.get(saga.definition)
        if definition is not None and definition.capability:
            return definition.capability
        return EXECUTE_CAPABILITY

    def _send_advance(self, saga_id: str) -> None:
        self._send(partial(self.dispatcher.send_advance, saga_id))

    def _send(self, send: Callable[[], None]) -> None:
        """Dispatch after a recorded intent; a failure is left to the sweep to repair."""
        try:
            send()
        except Exception:
            logger.exception("dispatch failed; the sweep will send it again")


def _resolution_phase(outcome: str) -> str:
    if outcome in ("committed", "compensated"):
        return Phase.COMMITTED
    return Phase.FAILED
