"""Child sagas in the engine (docs/design.md §3.7): start them, report their end to the parent,
undo them as a unit, and repair what a crash left between two of those writes.

Every action is idempotent: a child is started under an id fixed in its parent's record (a
second start finds it), a report moves the parent's step only while it still waits, and a
reopened child is only reopened from ``completed``. So the sweep can call ``reconcile`` on any
parent at any time: it starts a child whose start was lost, reports a child whose report was
lost, cancels the running children of a parent that rolls back, and undoes a completed child
whose parent compensates it.

A tree of sagas is walked in a loop, never by recursion: driving one saga of a tree may have to
drive another (a child reports to its parent, a parent reopens or cancels its children), and
every such call made while this thread already drives one waits in a queue the outermost call
empties (``_soon``). Limits hold before a child exists (docs/concepts.md "Limits"): a child
step deeper than ``sagas_child_depth_limit`` or past ``sagas_children_limit`` of its parent
fails with ``child_depth_exceeded`` or ``too_many_children``, and the parent rolls back.
"""

from __future__ import annotations

import contextvars
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from ._middleware import ChildOf, Middlewares, Operation
from ._protocol import codes, moves
from ._protocol.children import child_id_of, settle
from ._protocol.limits import Limits, child_position
from ._records import ParentRef, SagaRecord, SagaState, StepRecord, StepState
from ._repository import Plan, SagaRepository
from ._topology import Topology
from .errors import SagaConflictError, SagaError, SagaNotFound
from .stores.base import Fence

__all__ = ["ChildSagas", "Drive"]

logger = logging.getLogger("celery_sagas.children")

# A child limit's code -> the setting that sets it and its value (the refusal's log names both).
_LIMIT_OF: dict[str, Callable[[Limits], tuple[str, int]]] = {
    codes.CHILD_DEPTH_EXCEEDED: lambda limits: ("sagas_child_depth_limit", limits.child_depth),
    codes.TOO_MANY_CHILDREN: lambda limits: ("sagas_children_limit", limits.children),
}

_SETTLED = (SagaState.COMPLETED, SagaState.COMPENSATED, SagaState.MANUAL_REVIEW)


class _Start(Protocol):
    def __call__(self, definition: str, input: Any, saga_id: str, *,
                 trace_parent: str | None = None, parent: ParentRef | None = None) -> SagaRecord:
        ...


@dataclass(frozen=True, slots=True)
class Drive:
    """What child sagas ask of the engine that owns them: start a saga (idempotent by its id),
    drive one on, roll one back; the limits of saga trees, and the time (ms)."""

    start: _Start
    advance: Callable[[str, SagaRecord | None], SagaRecord]
    cancel: Callable[[str], SagaRecord]
    limits: Limits
    now: Callable[[], int]


class ChildSagas:
    """Starts, reports, undoes and reconciles the child sagas of one engine."""

    def __init__(self, repository: SagaRepository, topology: Topology, drive: Drive,
                 middlewares: Middlewares) -> None:
        self.repository = repository
        self.topology = topology
        self.drive = drive
        self.middlewares = middlewares
        # the queue of the saga tree this thread (or greenlet: sagas.aio) drives, if any
        self._queue: contextvars.ContextVar[deque[Callable[[], None]] | None] = \
            contextvars.ContextVar(f"saga_tree_{id(self)}", default=None)

    def _soon(self, saga_id: str, work: Callable[[], object]) -> None:
        """Do ``work`` (which drives the saga ``saga_id``) now, or, when this thread already
        drives a saga, once that is done: the outermost call empties the queue, so a tree of
        any depth or width costs a loop, not a stack. Work queued behind the first that fails
        is logged and left to the sweep; the first's error is the caller's."""
        fence = self.topology.fence_for(saga_id)

        def run() -> None:
            with self.topology.fenced(fence):
                work()

        queue = self._queue.get()
        if queue is not None:
            queue.append(run)
            return
        queue = deque()
        token = self._queue.set(queue)
        try:
            run()
            while queue:
                _logged(queue.popleft())
        finally:
            self._queue.reset(token)

    # ------------------------------------------------------------ forward

    def start_all(self, parent: SagaRecord, steps: Iterable[StepRecord]) -> None:
        """Start the children of newly recorded child steps (after the write that recorded them)."""
        for step in steps:
            if child_id_of(step) is not None:
                self._soon(parent.saga_id, partial(self.start, parent, step))

    def start(self, parent: SagaRecord, step: StepRecord) -> None:
        """Start the child a step names (or refuse it, past a limit); report it at once if it
        settled while starting."""
        parent_id, child_id, kwargs = parent.saga_id, child_id_of(step), step.kwargs
        assert child_id is not None
        ref = ParentRef(parent_id, step.name)
        try:
            refusal = self._refusal(parent, step)
            if refusal is not None:
                self._refuse(parent_id, step, child_id, refusal)
                return
            # a span under the parent's step, in its trace (docs/tracing.md)
            operation = Operation("saga.start", child_id, {"definition": kwargs["definition"]},
                                  child_of=ChildOf(parent.trace_parent, parent_id, step.name))
            with self.middlewares.around_operation(operation):
                child = self.drive.start(kwargs["definition"], kwargs.get("input"), child_id,
                                         trace_parent=operation.trace_parent, parent=ref)
        except SagaConflictError:
            self._taken(parent_id, step)
            return
        except SagaError:
            logger.exception("saga %s: child %s not started; the sweep will", parent_id, child_id)
            return
        if child.parent != ref:
            self._taken(parent_id, step)
            return
        self.report(child)

    def _refusal(self, parent: SagaRecord, step: StepRecord) -> str | None:
        """The code a child step breaks a limit with, or None: its place among its parent's
        children, then its depth (its ancestors read up to the limit, no further)."""
        limits = self.drive.limits
        if child_position(parent, step.name) > limits.children:
            return codes.TOO_MANY_CHILDREN
        depth, ref = 1, parent.parent
        while ref is not None:
            depth += 1
            if depth > limits.child_depth:
                return codes.CHILD_DEPTH_EXCEEDED
            ancestor = self.repository.get(ref.saga_id)
            ref = None if ancestor is None else ancestor.parent
        return codes.CHILD_DEPTH_EXCEEDED if depth > limits.child_depth else None

    def _refuse(self, parent_id: str, step: StepRecord, child_id: str, code: str) -> None:
        setting, limit = _LIMIT_OF[code](self.drive.limits)
        logger.warning("saga %s: child step %s refused: %s (past %s = %d)", parent_id,
                       step.name, code, setting, limit)

        def decide(parent: SagaRecord) -> Plan | None:
            current = parent.step(step.name)
            if current is None or current.state is not StepState.WAITING:
                return None
            return Plan(after=moves.refuse_child(parent, step.name, child_id, code,
                                                 self.drive.now()))

        parent, plan = self._update(parent_id, decide)
        if plan is not None:
            self._soon(parent_id, lambda: self.drive.advance(parent_id, parent))

    def report(self, child: SagaRecord) -> None:
        """Tell the parent of a child that completed, compensated or went to review."""
        ref = child.parent
        if ref is None or child.state not in _SETTLED:
            return
        orphaned: list[bool] = []

        def decide(parent: SagaRecord) -> Plan | None:
            step = parent.step(ref.step)
            if step is not None and step.state is StepState.FAILED and \
                    child.state is SagaState.COMPLETED and child_id_of(step) == child.saga_id:
                orphaned.append(True)  # the parent gave up on it before it began: undo it
            after = settle(parent, ref.step, child, self.drive.now())
            return None if after is None else Plan(after=after)

        try:
            parent, plan = self._update(ref.saga_id, decide)
        except SagaNotFound:
            logger.warning("child saga %s: its parent %s is gone", child.saga_id, ref.saga_id)
            return
        if orphaned:
            self._reopen(child.saga_id)
        if plan is not None:
            self._soon(ref.saga_id, lambda: self.drive.advance(ref.saga_id, parent))

    # ------------------------------------------------------------ backward

    def undo(self, parent_id: str, step: StepRecord) -> None:
        """Compensate a committed child step: reopen the completed child, or report a child
        already undone (or in review)."""
        child_id = child_id_of(step)
        assert child_id is not None
        child = self.repository.get(child_id)
        if child is None:
            logger.warning("saga %s: child %s to undo is gone", parent_id, child_id)
            return
        if child.state is SagaState.COMPLETED:
            self._reopen(child_id)
        elif child.state in _SETTLED:
            self.report(child)

    def _reopen(self, child_id: str) -> None:
        def decide(child: SagaRecord) -> Plan | None:
            if child.state is not SagaState.COMPLETED:
                return None
            return Plan(after=moves.reopen(child, self.drive.now()))

        child, plan = self._update(child_id, decide)
        if plan is not None or child.state is SagaState.COMPENSATING:
            self._soon(child_id, lambda: self.drive.advance(child_id, child))

    # ------------------------------------------------------------ repair

    def reconcile(self, saga: SagaRecord, fence: Fence | None = None) -> SagaRecord:
        """Bring every child step of ``saga`` in line with its child (sweep repair, cancel);
        the parent as it is afterwards. A sweep passes its fence: writes to the parent and to
        the children in its bucket (default child ids are) carry it."""
        acted = False
        with self.topology.fenced(fence):
            for step in saga.steps:
                child_id = child_id_of(step)
                if child_id is None or step.state not in (StepState.WAITING,
                                                          StepState.COMPENSATING):
                    continue
                acted = True
                try:
                    self._reconcile_step(saga, step, child_id)
                except SagaError:
                    logger.exception("saga %s: child %s not reconciled", saga.saga_id, child_id)
        return self.repository.load(saga.saga_id) if acted else saga

    def _reconcile_step(self, saga: SagaRecord, step: StepRecord, child_id: str) -> None:
        if step.state is StepState.COMPENSATING:
            self.undo(saga.saga_id, step)
            return
        child = self.repository.get(child_id)
        if child is None:
            if saga.rolling_back:
                self._abandon(saga.saga_id, step)
            elif saga.state is SagaState.RUNNING:
                self.start(saga, step)
            return
        if child.parent != ParentRef(saga.saga_id, step.name):
            self._taken(saga.saga_id, step)
        elif child.state in _SETTLED:
            self.report(child)
        elif saga.rolling_back and child.state is SagaState.RUNNING:
            self._soon(child_id, lambda: self.drive.cancel(child_id))

    def _abandon(self, parent_id: str, step: StepRecord) -> None:
        def decide(parent: SagaRecord) -> Plan | None:
            current = parent.step(step.name)
            if current is None or current.state is not StepState.WAITING:
                return None
            return Plan(after=moves.abandon_step(parent, step.name, step.effect_id, self.drive.now()))

        parent, plan = self._update(parent_id, decide)
        if plan is not None:
            self._soon(parent_id, lambda: self.drive.advance(parent_id, parent))

    def _taken(self, parent_id: str, step: StepRecord) -> None:
        reason = f"the id {child_id_of(step)!r} of child step {step.name!r} is another saga's"

        def decide(parent: SagaRecord) -> Plan | None:
            if parent.state not in (SagaState.RUNNING, SagaState.COMPENSATING):
                return None
            return Plan(after=moves.to_manual_review(parent, codes.CHILD_ID_TAKEN, reason,
                                                     self.drive.now()))

        self._update(parent_id, decide)

    def _update(self, saga_id: str, decide: Callable[[SagaRecord], Plan | None]
                ) -> tuple[SagaRecord, Plan | None]:
        return self.repository.update(saga_id, decide, fence=self.topology.fence_for(saga_id))


def _logged(work: Callable[[], None]) -> None:
    """Do queued work; a saga error is logged (the sweep repairs what it left undone)."""
    try:
        work()
    except SagaError:
        logger.exception("a saga of this tree was not driven on; the sweep will")
