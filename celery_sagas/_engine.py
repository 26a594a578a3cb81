"""The engine: ask the planner what a saga needs next, write it, then carry it out.

No Celery here and no concrete store: the engine is handed a ``SagaRepository`` (over the
``Store`` port), a ``Dispatcher``, the ``Gates`` of approvals, the middleware chain and a clock, and
builds the ``Planner`` (``_planner.py``) that turns the protocol's decisions into plans.
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
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import _values as values
from ._announcer import Announcer
from ._children import ChildSagas, Drive
from ._clock import Clock, SystemClock, now_ms
from ._definitions import Registry, SagaDefinition, Timing
from ._dispatch import Dispatcher
from ._events import EventBus, Phase, Stage
from ._frozen import replace
from ._middleware import Middlewares
from ._planner import GateOpener, GateOutcome, Planner
from ._protocol import codes, moves
from ._protocol.due import due_at
from ._protocol.kinds import awaiting_decision
from ._protocol.limits import Limits, signal_room
from ._protocol.notes import SignalNote, with_signal
from ._protocol.resolution import resolve as resolve_outcome
from ._records import (
    HistoryEvent,
    OperatorAction,
    ParentRef,
    SagaRecord,
    SagaState,
    StepRecord,
)
from ._repository import Plan, SagaRepository
from .errors import (
    PayloadTooLarge,
    SagaAlreadyFinal,
    SagaConfigurationError,
    SagaConflictError,
    SagaValidationError,
)
from .stores.base import Fence

__all__ = ["Engine", "EngineSettings", "GateOutcome", "Gates"]

logger = logging.getLogger("celery_sagas.engine")


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


class Gates(GateOpener, Protocol):
    """What the engine needs of approval gates (``_approvals.saga_gates`` implements it):
    the planner opens them, the engine reads their outcome."""

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
        middlewares: Middlewares | None = None,
        clock: Clock | None = None,
        new_id: Callable[[], str] = _new_effect_id,
        settings: EngineSettings | None = None,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.repository = repository
        self.registry = registry
        self.gates = gates
        # The one seam of cross-cutting concerns (docs/design.md §1.1); alone, events and logs.
        self.middlewares = middlewares if middlewares is not None else Middlewares([EventBus()])
        self.clock: Clock = clock or SystemClock()
        self.settings = settings or EngineSettings()
        # Randomness comes from here only (the jitter of default backoffs): a fraction in [0, 1).
        self.draw = draw
        self.topology = repository.topology
        self.children = ChildSagas(
            repository, self.topology,
            Drive(self.start, self.advance, self.cancel, self.settings.limits, self.now),
            self.middlewares)
        self.announcer = Announcer(self.middlewares, registry)
        self.planner = Planner(registry, dispatcher, self.announcer, self.topology, self.children,
                               clock=self.clock, timing=self.settings.timing, new_id=new_id,
                               gates=gates, inline=self.settings.inline,
                               inline_max_seconds=self.settings.inline_max_seconds)

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
        plan = self.planner.first_write(fresh)
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
                saga, plan = self.repository.update(saga_id, self.planner.plan, known=saga, fence=fence)
                if plan is None:
                    break
                plan.run_effects(saga)
            else:
                logger.warning("saga %s: stopped advancing after many decisions", saga_id)
            if saga.parent is not None:
                self.children.report(saga)  # a child that settled tells its parent (§3.7)
        return saga

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
        saga, plan = self.repository.update(
            saga_id, lambda s: self.planner.gate(s, name, approval_id, outcome, action), fence=fence)
        if plan is None:
            return saga, False
        plan.run_effects(saga)
        return self.advance(saga_id, saga, fence), True

    def record_action(self, saga_id: str, action: OperatorAction) -> SagaRecord:
        """Append an operator's action that changed no saga field (an approval granted on its
        own record) to the saga's history, in a write of its own."""
        saga, _ = self.repository.update(saga_id, lambda s: self.planner.recorded_action(s, action),
                                         fence=self.topology.fence_for(saga_id))
        return saga

    def reconcile_gates(self, saga: SagaRecord, fence: Fence | None = None) -> SagaRecord:
        """Bring every waiting gate of ``saga`` in line with its approval record (sweep repair)."""
        if self.gates is None:
            return saga
        for step in saga.steps:
            if not awaiting_decision(step) or step.approval_id is None:
                continue
            outcome = self.gates.outcome(saga.saga_id, step, fence)
            if outcome is not None:
                saga, _ = self.finish_gate(saga.saga_id, step.name, step.approval_id, outcome, fence)
        return saga

    def unknown_task(self, saga_id: str, step: str, effect_id: str, task: str) -> SagaRecord | None:
        """A worker received ``task`` for this effect and has no such task: manual review with
        ``unknown_task`` instead of a re-send every sweep. None when the effect was claimed
        or moved on meanwhile (nothing to do)."""
        saga, plan = self.repository.update(
            saga_id, lambda s: self.planner.unknown_task(s, step, effect_id, task))
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
        saga, _ = self.repository.update(
            saga_id, lambda s: self.planner.operator_move(s, action, move, needless),
            fence=self.topology.fence_for(saga_id))
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
        self.announcer.emit(written, changed, Stage.RECONCILIATION,
                            _resolution_phase(str(outcome)), error_code)
        return written

    # ------------------------------------------------------------ helpers


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
