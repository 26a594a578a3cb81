"""The engine: ask the protocol what a saga needs next, write it, then carry it out.

No Celery here and no concrete store: the engine is handed a ``SagaRepository`` (over the
``Store`` port), a ``Dispatcher``, the ``Gates`` of approvals, an event bus and a clock.
Every change is a ``Plan`` written through the repository's one compare-and-set loop; work is
dispatched only after the write that records its intent succeeded, and if the process dies
between the two, the sweep finds the intent and sends it again under the same effect id
(docs/design.md §3).
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from . import _inline as inline
from . import _values as values
from ._children import ChildSagas, ChildTrace, UntracedChildren
from ._clock import Clock, SystemClock, now_ms
from ._context import replay
from ._definitions import (
    COMPENSATE_CAPABILITY,
    EXECUTE_CAPABILITY,
    Registry,
    SagaDefinition,
    Timing,
)
from ._dispatch import Dispatcher
from ._events import EventBus, LifecycleEvent, Phase, Stage, effect_stage
from ._liveness import dead_effects
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
    Wake,
)
from ._protocol.due import due_at
from ._protocol.limits import Limits, signal_room
from ._protocol.notes import SignalNote, with_signal
from ._protocol.resolution import resolve as resolve_outcome
from ._records import (
    CHILD_TASK,
    AttemptRef,
    HistoryEvent,
    OperatorAction,
    ParentRef,
    SagaRecord,
    SagaState,
    StepRecord,
    StepState,
)
from ._repository import Plan, SagaRepository
from .errors import (
    IllegalTransition,
    PayloadTooLarge,
    SagaAlreadyFinal,
    SagaConfigurationError,
    SagaConflictError,
    SagaResolutionError,
    SagaValidationError,
)
from .stores.base import Fence

__all__ = ["Engine", "EngineSettings", "GateOutcome", "Gates"]

logger = logging.getLogger("celery_sagas.engine")

_START_DECISIONS = 16  # decisions start() may take in memory before the first write


def _new_effect_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Limits the engine applies (sizes in bytes, durations in ms)."""

    payload_limit: int = values.DEFAULT_PAYLOAD_LIMIT
    timing: Timing = field(default_factory=Timing)
    limits: Limits = field(default_factory=Limits)
    inline: bool = False  # sagas_inline_steps: the default of @sagas.saga(inline=...)
    inline_max_steps: int = 16  # consecutive inline steps in one task
    inline_max_seconds: float = 60.0  # how long one task may go on running inline steps


@dataclass(frozen=True, slots=True)
class GateOutcome:
    """What an approval record says of its gate: passed (with the decision) or failed."""

    result: dict[str, Any] | None = None
    failure: str | None = None


class Gates(Protocol):
    """What the engine needs of approval gates (``_approvals.saga_gates`` implements it)."""

    def open(self, saga_id: str, gate: StepRecord) -> None:
        """Create the pending approval of a gate step before the step is recorded."""
        ...

    def outcome(self, saga_id: str, gate: StepRecord, fence: Fence | None) -> GateOutcome | None:
        """What the gate's approval record says now (expiring it first when due), or None
        while it still waits."""
        ...


class Engine:
    """Drives sagas over a repository; every public method validates before it writes."""

    def __init__(
        self,
        repository: SagaRepository,
        registry: Registry,
        dispatcher: Dispatcher,
        *,
        gates: Gates | None = None,
        events: EventBus | None = None,
        clock: Clock | None = None,
        new_id: Callable[[], str] = _new_effect_id,
        settings: EngineSettings | None = None,
        draw: Callable[[], float] = random.random,
        trace_children: ChildTrace | None = None,
    ) -> None:
        self.repository = repository
        self.registry = registry
        self.dispatcher = dispatcher
        self.gates = gates
        self.events = events or EventBus()
        self.clock: Clock = clock or SystemClock()
        self.new_id = new_id
        self.settings = settings or EngineSettings()
        # Randomness comes from here only (the jitter of default backoffs): a fraction in [0, 1).
        self.draw = draw
        self.trace_children: ChildTrace = trace_children or UntracedChildren()
        self.topology = repository.topology
        self.children = ChildSagas(self, self.topology)

    # ------------------------------------------------------------ records

    @property
    def limits(self) -> Limits:
        """The limits of saga trees and signals (docs/concepts.md "Limits")."""
        return self.settings.limits

    def now(self) -> int:
        """The current time in ms, validated."""
        return now_ms(self.clock)

    def get(self, saga_id: str) -> SagaRecord | None:
        """The saga record, or None when absent; payloads no configured key decrypts read as
        ``ENCRYPTED`` (to show, never to act on)."""
        return self.repository.view(saga_id)

    def load(self, saga_id: str) -> SagaRecord:
        """The saga record; SagaNotFound when absent."""
        return self.repository.load(saga_id)

    def definition_of(self, saga: SagaRecord) -> SagaDefinition:
        """The definition a saga was started with (must be registered in this process)."""
        return self.registry.definition(saga.definition)

    # ------------------------------------------------------------ start

    def start(self, definition: str, input: Any, saga_id: str, *,
              trace_parent: str | None = None,
              parent: ParentRef | None = None) -> SagaRecord:
        """Create the saga with its first step's intent, then send that step (docs/design.md
        §3.1); idempotent for the same definition and input. ``trace_parent`` (a W3C
        traceparent) is kept in the record; a malformed one is dropped, never an error.
        ``parent``: the saga and step a child saga reports to (§3.7)."""
        values.saga_id(saga_id)
        self.registry.definition(definition)
        canonical = values.encode_json(input, field="saga input", limit=self.settings.payload_limit)
        now = self.now()
        fresh = SagaRecord(saga_id, definition, SagaState.RUNNING, values.decode_json(canonical),
                           now, now, version=0, trace_parent=_valid_trace_parent(trace_parent),
                           parent=parent)
        plan = self._first_write(fresh)
        if plan.before is not None:
            plan.before()
        try:
            try:
                record = self._create(plan)
            except PayloadTooLarge:
                fallback = plan.fallback()
                if fallback is None:
                    raise
                plan, record = fallback, self._create(fallback)
        except PayloadTooLarge as exc:
            raise _record_too_large(exc, canonical, self.settings.payload_limit) from None
        if record is not None:
            plan.run_effects(record)
            due = due_at(record)
            if due is not None and due <= self.now():
                return self.advance(saga_id, record)  # sleep(0), a past sleep_until
            return record
        return self._existing(saga_id, definition, canonical)

    def _create(self, plan: Plan) -> SagaRecord | None:
        """Create the plan's record; None when the saga id exists already."""
        assert plan.after is not None
        return self.repository.create(plan.after)

    def _first_write(self, fresh: SagaRecord) -> Plan:
        """Replay ``run`` in this process up to its first step: the record to create (version 1),
        what to do before and once it exists, and what to create instead if it is too large."""
        record, before, too_large = fresh, None, None
        effects: list[Callable[[SagaRecord], None]] = []
        for _ in range(_START_DECISIONS):
            plan = self.plan(record)
            if plan is None or plan.after is None:
                break
            fallback = plan.fallback()
            if fallback is not None and fallback.after is not None:
                too_large = Plan(after=replace(fallback.after, version=1), then=tuple(effects))
            record, before = plan.after, before or plan.before
            effects.extend(plan.then)
            if record.steps or record.state is not SagaState.RUNNING:
                break
        return Plan(after=replace(record, version=1), before=before, then=tuple(effects),
                    too_large=too_large)

    def _existing(self, saga_id: str, definition: str, canonical: str) -> SagaRecord:
        existing = self.load(saga_id)
        same_input = values.encode_json(existing.input, limit=2**53) == canonical
        if existing.definition != definition or not same_input:
            raise SagaConflictError(saga_id=saga_id)
        if existing.state is SagaState.RUNNING and not existing.steps:
            return self.advance(saga_id, existing)  # created by a version that sent an advance task
        return existing

    # ------------------------------------------------------------ progress

    def advance(self, saga_id: str, known: SagaRecord | None = None,
                fence: Fence | None = None) -> SagaRecord:
        """Write and carry out decisions until the saga waits for something outside this process."""
        fence = fence if fence is not None else self.topology.fence_for(saga_id)
        with self.topology.fenced(fence):
            saga = known if known is not None else self.load(saga_id)
            for _ in range(4 * len(saga.steps) + 16):
                saga, plan = self.repository.update(saga_id, self.plan, known=saga, fence=fence)
                if plan is None:
                    break
                plan.run_effects(saga)
            else:
                logger.warning("saga %s: stopped advancing after many decisions", saga_id)
            if saga.parent is not None:
                self.children.report(saga)  # a child that settled tells its parent (§3.7)
        return saga

    def decision(self, saga: SagaRecord) -> Decision:
        """The protocol's next decision for this record, now."""
        if saga.state.final or saga.state is SagaState.MANUAL_REVIEW:
            return Wait()
        definition = self.definition_of(saga)
        policy = self.registry.policy(definition, self.settings.timing)
        now = self.now()

        def run_replay() -> Any:
            return replay(definition, saga, self.registry, self.new_id, now,
                          lambda: self.topology.colocated_id(saga.saga_id),
                          lambda candidate: self.topology.colocated(saga.saga_id, candidate))

        return decide(saga, run_replay, now, policy, dead_effects(saga.steps))

    def plan(self, saga: SagaRecord) -> Plan | None:
        """What the next decision writes and does, or None when the saga must wait."""
        decision = self.decision(saga)
        if isinstance(decision, Wait):
            return None
        return self._plan(saga, decision, self.now())

    def continued(self, moved: SagaRecord, announce: Callable[[SagaRecord], None],
                  too_large: Plan | Callable[[], Plan] | None = None) -> Plan:
        """``moved`` (one move of a stored record, not yet written) together with the decision
        that follows it, as one write: a step's commit and the next step's intent cost one
        round trip, not two. If the merged record is over the payload limit, ``moved`` alone
        (and if that is too, ``too_large``)."""
        alone = Plan(after=moved, then=(announce,), too_large=too_large)
        follow = self.plan(moved)
        if follow is None or follow.after is None:
            return alone
        return Plan(
            after=replace(follow.after, version=moved.version), before=follow.before,
            then=(announce, *follow.then), too_large=alone,
        )

    def _plan(self, saga: SagaRecord, decision: Decision, now: int) -> Plan:
        if isinstance(decision, Append):
            return self._plan_append(saga, decision, now)
        if isinstance(decision, Redispatch):
            return Plan(after=moves.mark_redispatched(saga, decision.step.name, now),
                        then=(self._sender(decision.step.name, decision.compensation),))
        if isinstance(decision, BeginCompensation):
            return self._plan_compensation(saga, decision.step, now)
        if isinstance(decision, Vanished):
            return self.vanished(saga, decision, now)
        if isinstance(decision, Wake):
            woken = decision.step
            return Plan(after=moves.wake_step(saga, woken.name, woken.effect_id, decision.result,
                                              now, decision.signal_id),
                        then=(lambda w: self.emit(w, woken, Stage.EXECUTION, Phase.COMMITTED),))
        if isinstance(decision, Abandon):
            step = decision.step
            abandoned = moves.abandon_step(saga, step.name, step.effect_id, now,
                                           nothing_committed=decision.nothing_committed)
            failed = abandoned.step(step.name)
            code = failed.error_code if failed is not None else None
            return Plan(after=abandoned,
                        then=(lambda w: self.emit(w, step, Stage.EXECUTION, Phase.FAILED,
                                                  code or codes.NOT_STARTED),))
        return Plan(after=self._saga_move(saga, decision, now))

    def _plan_append(self, saga: SagaRecord, decision: Append, now: int) -> Plan:
        gates = [s for s in decision.steps if s.state is StepState.AWAITING_APPROVAL]
        if gates and self.gates is None:
            reason = "ctx.approval needs approval secrets (sagas_approval_secrets)"
            return Plan(after=moves.to_manual_review(saga, codes.INVALID_STEP_CALL, reason, now))
        opener = self.gates

        def open_gates() -> None:
            for gate in gates:
                assert opener is not None
                opener.open(saga.saga_id, gate)

        def announce(written: SagaRecord) -> None:
            for step in decision.steps:
                self.emit(written, step, Stage.EXECUTION, Phase.INTENT)
                if step.state is StepState.EXECUTING and not inline.held(step.effect_id):
                    self._send(partial(self.dispatcher.send_step, written.saga_id, step,
                                       written.version, trace_parent=written.trace_parent))
            self.children.start_all(written, decision.steps)

        reason = "the arguments of the next step would exceed the payload limit"
        return Plan(after=moves.append_steps(saga, decision.steps, now, decision.patches),
                    before=open_gates if gates else None, then=(announce,),
                    too_large=Plan(after=moves.to_manual_review(saga, codes.PAYLOAD_TOO_LARGE,
                                                                reason, now)))

    def _plan_compensation(self, saga: SagaRecord, step: StepRecord, now: int) -> Plan:
        def announce(written: SagaRecord) -> None:
            begun = written.step(step.name)
            assert begun is not None
            self.emit(written, begun, Stage.COMPENSATION, Phase.INTENT)
            self._send(self._compensator_sender(written, begun))

        return Plan(after=moves.begin_compensation(saga, step.name, now), then=(announce,))

    def _sender(self, name: str, compensation: bool) -> Callable[[SagaRecord], None]:
        def send(written: SagaRecord) -> None:
            step = written.step(name)
            assert step is not None
            if compensation:
                self._send(self._compensator_sender(written, step))
            else:
                self._send(lambda: self.dispatcher.send_step(
                    written.saga_id, step, written.version, trace_parent=written.trace_parent))

        return send

    def _compensator_sender(self, written: SagaRecord, step: StepRecord) -> Callable[[], None]:
        """Send a step's compensator; a child step's "compensator" reopens the child (§3.7)."""
        if step.task == CHILD_TASK:
            return lambda: self.children.undo(written.saga_id, step)
        return lambda: self.dispatcher.send_compensation(written.saga_id, step, written.version,
                                                         trace_parent=written.trace_parent)

    def _saga_move(self, saga: SagaRecord, decision: Decision, now: int) -> SagaRecord:
        if isinstance(decision, Complete):
            return moves.complete(saga, now, decision.patches, decision.result)
        if isinstance(decision, FinishCompensation):
            return moves.finish_compensation(saga, now)
        if isinstance(decision, StartCompensation):
            return moves.start_compensation(saga, decision.error_code, decision.reason, now)
        assert isinstance(decision, Review), decision
        logger.warning("saga %s needs manual review: %s", saga.saga_id, decision.error_code)
        reviewed = moves.to_manual_review(saga, decision.error_code, decision.reason, now)
        return replace(reviewed, exception=decision.exception) if decision.exception else reviewed

    def vanished(self, saga: SagaRecord, decision: Vanished, now: int) -> Plan:
        """The write that settles an attempt that went silent: a retry, or ambiguity."""
        step = decision.step
        if decision.compensation:
            ref, stage = AttemptRef.compensation(step), Stage.COMPENSATION
            after = (moves.compensation_failed(saga, ref, now, now) if decision.retry
                     else moves.compensation_ambiguous(saga, ref, now))
        else:
            ref, stage = AttemptRef.execution(step), Stage.EXECUTION
            after = (moves.release_step(saga, ref, now, decision.error_code, now) if decision.retry
                     else moves.step_ambiguous(saga, ref, decision.error_code, now,
                                               compensate=decision.compensate))
        phase = Phase.FAILED if decision.retry else Phase.AMBIGUOUS
        return Plan(after=after, then=(lambda w: self.emit(w, step, stage, phase, decision.error_code),))

    # ------------------------------------------------------------ signals

    def signal(self, saga_id: str, name: str, payload: Any = None,
               signal_id: str | None = None, *, actor: str | None = None,
               reason: str | None = None) -> SagaRecord:
        """Record a signal for a saga (docs/design.md §3.5): one note appended at the version
        read, once every limit is checked (a repeated ``signal_id`` is one signal), then
        advance the saga so a wait for it commits at once. The record after that. ``actor``
        and ``reason`` go to its history."""
        values.saga_id(saga_id)
        values.signal_name(name)
        action = _action(HistoryEvent.SIGNAL, actor, reason)
        sent_id = str(uuid.uuid4()) if signal_id is None else values.signal_id(signal_id)
        canonical = values.encode_json(payload, field="signal payload",
                                       limit=max(1, self.settings.payload_limit // 4))
        value = values.decode_json(canonical)
        note = SignalNote(sent_id, name, self.repository.codec.payload_out(value), self.now(),
                          action.actor, action.reason)

        def decide_signal(saga: SagaRecord) -> Plan | None:
            if any(s.signal_id == sent_id for s in saga.signals):
                return None  # a repeat: the signal is there already
            if saga.state.final:
                raise SagaAlreadyFinal(saga_id=saga_id, state=str(saga.state))
            signal_room(saga, len(canonical.encode("utf-8")), self.settings.limits)
            self.repository.codec.saga_envelope(with_signal(saga, note, value))  # size check
            return Plan(note=note.text())

        try:
            record, _ = self.repository.update(saga_id, decide_signal)
        except PayloadTooLarge as exc:
            raise _too_large_with(exc, "signal payload", canonical, self.settings.payload_limit,
                                  encoded=True) from None
        if record.state is not SagaState.RUNNING:
            return record
        try:
            return self.advance(saga_id, record)
        except SagaConfigurationError:
            # a process that sends signals without the saga's code: the signal is recorded,
            # the sweep's running pass delivers it once the saga is stale
            logger.warning("saga %s: signal recorded; its definition is not in this process",
                           saga_id)
            return record

    # ------------------------------------------------------------ approval gates

    def finish_gate(self, saga_id: str, name: str, approval_id: str, outcome: GateOutcome,
                    fence: Fence | None = None, action: OperatorAction | None = None
                    ) -> tuple[SagaRecord, bool]:
        """Pass or fail a gate step as its approval record says; (record, whether this call
        did it). SagaResolutionError when the saga has no such gate. ``action``: the decision
        that did it (who denied), for the history."""

        def decide_gate(saga: SagaRecord) -> Plan | None:
            step = saga.step(name)
            if step is None or step.approval_id != approval_id:
                raise SagaResolutionError(f"saga {saga_id!r} has no gate {name!r} for that approval")
            if step.state is not StepState.AWAITING_APPROVAL:
                return None
            now = self.now()
            if outcome.failure is None:
                after = moves.pass_gate(saga, name, approval_id, outcome.result, now)
            else:
                after = moves.fail_gate(saga, name, approval_id, outcome.failure, now)
            phase = Phase.COMMITTED if outcome.failure is None else Phase.FAILED
            return Plan(after=after, action=action,
                        then=(lambda w: self.emit(w, step, Stage.EXECUTION, phase,
                                                  outcome.failure),))

        saga, plan = self.repository.update(saga_id, decide_gate, fence=fence)
        if plan is None:
            return saga, False
        plan.run_effects(saga)
        return self.advance(saga_id, saga, fence), True

    def record_action(self, saga_id: str, action: OperatorAction) -> SagaRecord:
        """Append an operator's action that changed no saga field (an approval granted on its
        own record) to the saga's history, in a write of its own."""

        def decide_record(saga: SagaRecord) -> Plan:
            at = max(self.now(), saga.updated_at_ms)
            return Plan(after=moves.one_write(saga, replace(saga, updated_at_ms=at)),
                        action=action)

        saga, _ = self.repository.update(saga_id, decide_record, fence=self.topology.fence_for(saga_id))
        return saga

    def reconcile_gates(self, saga: SagaRecord, fence: Fence | None = None) -> SagaRecord:
        """Bring every waiting gate of ``saga`` in line with its approval record (sweep repair)."""
        if self.gates is None:
            return saga
        for step in saga.steps:
            if step.state is not StepState.AWAITING_APPROVAL or step.approval_id is None:
                continue
            outcome = self.gates.outcome(saga.saga_id, step, fence)
            if outcome is not None:
                saga, _ = self.finish_gate(saga.saga_id, step.name, step.approval_id, outcome, fence)
        return saga

    def unknown_task(self, saga_id: str, step: str, effect_id: str, task: str) -> SagaRecord | None:
        """A worker received ``task`` for this effect and has no such task: manual review with
        ``unknown_task`` instead of a re-send every sweep. None when the effect was claimed
        or moved on meanwhile (nothing to do)."""

        def decide_unknown(saga: SagaRecord) -> Plan | None:
            try:
                return Plan(after=moves.unknown_task(saga, step, effect_id, task, self.now()))
            except IllegalTransition:
                return None

        saga, plan = self.repository.update(saga_id, decide_unknown)
        if plan is None:
            return None
        logger.error("saga %s needs manual review: %s: %s", saga_id, codes.UNKNOWN_TASK, saga.reason)
        return saga

    # ------------------------------------------------------------ operator actions

    def cancel(self, saga_id: str, *, actor: str | None = None,
               reason: str | None = None) -> SagaRecord:
        """Stop forward progress and compensate what committed; a final saga is left as is.
        ``actor`` (who) and ``reason`` (why) are kept in the saga's history."""

        def settled(saga: SagaRecord) -> bool:
            return saga.state.final or saga.state is SagaState.COMPENSATING

        action = _action(HistoryEvent.CANCEL, actor, reason)
        cancelled = self._operator_move(saga_id, action, moves.cancel, settled)
        return self.children.reconcile(cancelled)  # running children are cancelled too

    def resume(self, saga_id: str, *, actor: str | None = None,
               reason: str | None = None) -> SagaRecord:
        """Lift manual review (once nothing is unresolved) and drive the saga on. ``actor``
        (who) and ``reason`` (why) are kept in the saga's history."""

        def not_in_review(saga: SagaRecord) -> bool:
            return saga.state is not SagaState.MANUAL_REVIEW

        action = _action(HistoryEvent.RESUME, actor, reason)
        return self._operator_move(saga_id, action, moves.resume, not_in_review)

    def _operator_move(
        self,
        saga_id: str,
        action: OperatorAction,
        move: Callable[[SagaRecord, int], SagaRecord],
        needless: Callable[[SagaRecord], bool],
    ) -> SagaRecord:
        """Apply an operator's move (re-deciding on a lost race), then advance."""
        verb = str(action.event)

        def decide_move(saga: SagaRecord) -> Plan | None:
            if needless(saga):
                return None
            try:
                return Plan(after=move(saga, self.now()), action=action)
            except IllegalTransition as exc:
                raise SagaResolutionError(
                    f"saga {saga_id!r} has an unresolved step; resolve it first ({verb} refused)"
                ) from exc

        saga, _ = self.repository.update(saga_id, decide_move, fence=self.topology.fence_for(saga_id))
        return saga if saga.state.final else self.advance(saga_id, saga)

    def resolve(self, saga_id: str, step: str, effect_id: str, outcome: str, *,
                result: Any = None, error_code: str | None = None, actor: str | None = None,
                reason: str | None = None) -> SagaRecord:
        """Record what an operator found out about an unknown outcome (no advance); ``actor``
        (who) and ``reason`` (why) are kept in the saga's history beside the ambiguity."""
        values.step_name(step)
        values.effect_id(effect_id)
        normalised = values.json_value(result, field="result")
        action = replace(_action(HistoryEvent.RESOLVE, actor, reason), step=step,
                         state=str(outcome), code=error_code)

        def decide_resolution(saga: SagaRecord) -> Plan:
            after = resolve_outcome(
                saga, step, effect_id, outcome, now_ms=self.now(),
                max_compensation_attempts=self.definition_of(saga).max_compensation_attempts,
                result=normalised, error_code=error_code,
            )
            return Plan(after=after, action=action)

        try:
            written, _ = self.repository.update(saga_id, decide_resolution)
        except PayloadTooLarge as exc:
            raise _too_large_with(exc, "result", normalised, self.settings.payload_limit) from None
        changed = written.step(step)
        assert changed is not None
        self.emit(written, changed, Stage.RECONCILIATION, _resolution_phase(str(outcome)), error_code)
        return written

    # ------------------------------------------------------------ helpers

    def emit(
        self, saga: SagaRecord, step: StepRecord, stage: Stage, phase: Phase,
        error_code: str | None = None, duration_ms: int | None = None,
    ) -> None:
        """Publish a step's effect transition as a lifecycle event.

        ``saga`` is the record after the move (``step`` may be the step before it): the
        step's state there tells which effect an operator's resolution settled.
        """
        current = saga.step(step.name) or step
        compensating = effect_stage(stage, current.state) == Stage.COMPENSATION
        self.events.emit(LifecycleEvent(
            effect_id=step.compensation_effect_id if compensating else step.effect_id,
            capability=self.capability(saga, step, compensating),
            stage=stage,
            phase=phase,
            attempt=step.compensation_attempts if compensating else step.attempts,
            saga_id=saga.saga_id,
            definition=saga.definition,
            step=step.name,
            error_code=error_code,
            duration_ms=duration_ms,
        ))

    def capability(self, saga: SagaRecord, step: StepRecord, compensating: bool) -> str:
        """The capability of a step's effect: the step's (or compensator's) option if set, else
        the definition's (steps only), else the default."""
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

    def _send(self, send: Callable[[], None]) -> None:
        """Dispatch after a recorded intent; a failure is left to the sweep to repair."""
        try:
            send()
        except Exception:
            logger.exception("dispatch failed; the sweep will send it again")


def _action(event: HistoryEvent, actor: str | None, reason: str | None) -> OperatorAction:
    """An operator's action for the history, its actor and reason checked (nothing written
    when either is malformed)."""
    return OperatorAction(event, None if actor is None else values.actor(actor),
                          None if reason is None else values.reason(reason))


def _valid_trace_parent(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return values.traceparent(value)
    except SagaValidationError:
        return None


def _record_too_large(exc: PayloadTooLarge, canonical: str, limit: int) -> PayloadTooLarge:
    """The input fits the limit, the record around it does not: say so in the input's terms."""
    return _too_large_with(exc, "saga input", canonical, limit, encoded=True)


def _too_large_with(exc: PayloadTooLarge, field: str, value: Any, limit: int, *,
                    encoded: bool = False) -> PayloadTooLarge:
    """A record over the limit because of ``value``: an error naming the value's own size."""
    text = value if encoded else values.encode_json(value, field=field, limit=2**53)
    size = len(text.encode("utf-8"))
    record = getattr(exc, "size", None)
    total = f" ({record} bytes in all)" if record else ""
    return PayloadTooLarge(
        f"{field} is {size} bytes; the saga record that carries it, with its ids, steps and "
        f"their arguments and results{total}, is over the {limit}-byte limit "
        "(sagas_payload_limit): pass a smaller value or raise sagas_payload_limit",
        size=size, limit=limit,
    )


def _resolution_phase(outcome: str) -> Phase:
    if outcome in ("committed", "compensated"):
        return Phase.COMMITTED
    return Phase.FAILED
