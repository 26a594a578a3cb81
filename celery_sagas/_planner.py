"""The planner: what a saga's next decision writes and what it does once written.

The protocol decides (``_protocol/decide.py``, a pure function of the record, the replay of
``run`` and the time); the planner turns its decision into a ``Plan`` for the repository's one
compare-and-set loop: the record after the move, what to do right before the write (open an
approval), and what to carry out once it is written (announce the move, send the step, start
a child). It writes nothing itself: the engine and a delivery write its plans (docs/design.md
§3).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass
from functools import partial
from typing import Any, Protocol

from . import _inline as inline
from ._announcer import Announcer
from ._clock import Clock, now_ms
from ._context import SagaContext, replay
from ._definitions import Registry, Timing
from ._dispatch import Dispatcher
from ._events import Phase, Stage
from ._frozen import replace
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
from ._protocol.kinds import Undo, awaiting_decision, kind_of
from ._records import (
    AttemptRef,
    OperatorAction,
    SagaRecord,
    SagaState,
    StepRecord,
    StepState,
)
from ._repository import Plan
from ._topology import Topology
from .errors import IllegalTransition, SagaResolutionError

__all__ = ["ChildSteps", "GateOpener", "GateOutcome", "Planner"]

logger = logging.getLogger("celery_sagas.engine")

_START_DECISIONS = 16  # decisions a start may take in memory before the first write


@dataclass(frozen=True, slots=True)
class GateOutcome:
    """What an approval record says of its gate: passed (with the decision) or failed."""

    result: dict[str, Any] | None = None
    failure: str | None = None


class GateOpener(Protocol):
    """What the planner needs of approval gates: open one before its step is recorded."""

    def open(self, saga_id: str, gate: StepRecord) -> None:
        """Create the pending approval of a gate step before the step is recorded."""
        ...


class ChildSteps(Protocol):
    """What the planner needs of child sagas (``_children.ChildSagas``)."""

    def start_all(self, parent: SagaRecord, steps: Iterable[StepRecord]) -> None:
        """Start the children of newly recorded child steps."""
        ...

    def undo(self, parent_id: str, step: StepRecord) -> None:
        """Undo the child saga of a parent's child step (its "compensator")."""
        ...


@dataclass(eq=False, repr=False)  # a collaborator, equal only to itself
class Planner:
    """Turns the protocol's decisions into plans; every collaborator is handed in."""

    registry: Registry
    dispatcher: Dispatcher
    announcer: Announcer
    topology: Topology
    children: ChildSteps
    _: KW_ONLY
    clock: Clock
    timing: Timing
    new_id: Callable[[], str]
    gates: GateOpener | None = None
    inline: bool = False  # sagas_inline_steps: the default of @sagas.saga(inline=...)
    inline_max_seconds: float = 60.0

    def first_write(self, fresh: SagaRecord) -> Plan:
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

    def decision(self, saga: SagaRecord) -> Decision:
        """The protocol's next decision for this record, now."""
        if saga.state.final or saga.state is SagaState.MANUAL_REVIEW:
            return Wait()
        definition = self.registry.definition(saga.definition)
        policy = self.registry.policy(definition, self.timing)
        now = now_ms(self.clock)

        def run_replay() -> Any:
            return replay(definition, SagaContext(
                saga, self.registry, self.new_id, now,
                lambda: self.topology.colocated_id(saga.saga_id),
                lambda candidate: self.topology.colocated(saga.saga_id, candidate)))

        return decide(saga, run_replay, now, policy, dead_effects(saga.steps))

    def plan(self, saga: SagaRecord) -> Plan | None:
        """What the next decision writes and does, or None when the saga must wait."""
        decision = self.decision(saga)
        if isinstance(decision, Wait):
            return None
        return self._plan(saga, decision, now_ms(self.clock))

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
                        then=(lambda w: self.announcer.emit(w, woken, Stage.EXECUTION, Phase.COMMITTED),))
        if isinstance(decision, Abandon):
            step = decision.step
            abandoned = moves.abandon_step(saga, step.name, step.effect_id, now,
                                           nothing_committed=decision.nothing_committed)
            failed = abandoned.step(step.name)
            code = failed.error_code if failed is not None else None
            return Plan(after=abandoned,
                        then=(lambda w: self.announcer.emit(w, step, Stage.EXECUTION, Phase.FAILED,
                                                  code or codes.NOT_STARTED),))
        return Plan(after=self._saga_move(saga, decision, now))

    def _plan_append(self, saga: SagaRecord, decision: Append, now: int) -> Plan:
        gates = [s for s in decision.steps if awaiting_decision(s)]
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
                self.announcer.emit(written, step, Stage.EXECUTION, Phase.INTENT)
                if step.state is StepState.EXECUTING and not inline.held(step.effect_id):
                    self._send(self._step_sender(written, step))
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
            self.announcer.emit(written, begun, Stage.COMPENSATION, Phase.INTENT)
            self._send(self._compensator_sender(written, begun))

        return Plan(after=moves.begin_compensation(saga, step.name, now), then=(announce,))

    def _sender(self, name: str, compensation: bool) -> Callable[[SagaRecord], None]:
        def send(written: SagaRecord) -> None:
            step = written.step(name)
            assert step is not None
            if compensation:
                self._send(self._compensator_sender(written, step))
            else:
                self._send(self._step_sender(written, step))

        return send

    def _step_sender(self, written: SagaRecord, step: StepRecord) -> Callable[[], None]:
        """Send a step's task; a step of an inline saga with room for its chain (§3.2)."""
        return partial(self.dispatcher.send_step, written.saga_id, step, written.version,
                       trace_parent=written.trace_parent,
                       time_limit_s=self._inline_room(written, step))

    def _inline_room(self, saga: SagaRecord, step: StepRecord) -> float | None:
        """The hard limit (s) a step of an inline saga is sent with: its own limit plus
        ``sagas_inline_max_seconds``, so that the chain of inline steps it may run fits; the
        task enforces the body's own limit itself. None for every other step."""
        definition = self.registry.definitions.get(saga.definition)
        options = self.registry.steps.get(step.task)
        if definition is None or options is None or not options.inline or not options.time_limit_ms:
            return None
        chosen = definition.inline if definition.inline is not None else self.inline
        return options.time_limit_ms / 1000 + self.inline_max_seconds if chosen else None

    def _compensator_sender(self, written: SagaRecord, step: StepRecord) -> Callable[[], None]:
        """Send a step's compensator; a child step's "compensator" reopens the child (§3.7)."""
        if kind_of(step).undo is Undo.CHILD_SAGA:
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
        if decision.exception is None:
            return reviewed
        return replace(reviewed, exception=decision.exception, traceback=decision.traceback)

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
        return Plan(after=after, then=(lambda w: self.announcer.emit(w, step, stage, phase,
                                                                     decision.error_code),))

    def gate(self, saga: SagaRecord, name: str, approval_id: str, outcome: GateOutcome,
             action: OperatorAction | None) -> Plan | None:
        """Pass or fail a gate step as its approval record says; None when the step no longer
        waits. SagaResolutionError when the saga has no such gate."""
        step = saga.step(name)
        if step is None or step.approval_id != approval_id:
            raise SagaResolutionError(
                f"saga {saga.saga_id!r} has no gate {name!r} for that approval")
        if not awaiting_decision(step):
            return None
        now = now_ms(self.clock)
        if outcome.failure is None:
            after = moves.pass_gate(saga, name, approval_id, outcome.result, now)
        else:
            after = moves.fail_gate(saga, name, approval_id, outcome.failure, now)
        phase = Phase.COMMITTED if outcome.failure is None else Phase.FAILED
        return Plan(after=after, action=action,
                    then=(lambda w: self.announcer.emit(w, step, Stage.EXECUTION, phase,
                                                        outcome.failure),))

    def operator_move(self, saga: SagaRecord, action: OperatorAction,
                      move: Callable[[SagaRecord, int], SagaRecord],
                      needless: Callable[[SagaRecord], bool]) -> Plan | None:
        """An operator's move of ``saga`` (None when ``needless``); SagaResolutionError when an
        unresolved step refuses it."""
        if needless(saga):
            return None
        try:
            return Plan(after=move(saga, now_ms(self.clock)), action=action)
        except IllegalTransition as exc:
            raise SagaResolutionError(
                f"saga {saga.saga_id!r} has an unresolved step; resolve it first "
                f"({action.event!s} refused)"
            ) from exc

    def recorded_action(self, saga: SagaRecord, action: OperatorAction) -> Plan:
        """A write that changes no saga field and adds an operator's action to its history."""
        at = max(now_ms(self.clock), saga.updated_at_ms)
        return Plan(after=moves.one_write(saga, replace(saga, updated_at_ms=at)), action=action)

    def unknown_task(self, saga: SagaRecord, step: str, effect_id: str, task: str) -> Plan | None:
        """Manual review with ``unknown_task`` for an effect whose task no worker has; None
        when the effect was claimed or moved on meanwhile."""
        try:
            return Plan(after=moves.unknown_task(saga, step, effect_id, task, now_ms(self.clock)))
        except IllegalTransition:
            return None

    def _send(self, send: Callable[[], None]) -> None:
        """Dispatch after a recorded intent; a failure is left to the sweep to repair."""
        try:
            send()
        except Exception:
            logger.exception("dispatch failed; the sweep will send it again")
