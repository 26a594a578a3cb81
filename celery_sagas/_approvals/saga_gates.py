"""Approval gates inside sagas: ``sagas.approvals`` (docs/design.md §3.8).

A saga reaching ``ctx.approval(...)`` records a step in ``awaiting-approval`` and a pending
approval, and holds no worker. Then:

- the party that started the saga reads the approval and its token with ``pending(saga_id)``
  (typically a web handler that shows it to the requester or mails it to the approver);
- a manager decides with ``decide(approval_id, tenant_id=..., decision=..., decided_by=...)``;
  a denial fails the gate at once and the saga compensates what came before;
- the requester resumes with ``resume(saga_id, token, tenant_id=..., principal_id=...)``: the
  token is verified and consumed (exactly once) and the saga continues;
- an approval past its expiry counts as denied (the sweep expires it).

Each of those touches the approval record first and the saga second. If a process dies in
between, the sweep brings the gate step in line with its approval record: ``SagaGates`` is
what the engine asks (``Gates``), and the engine writes the saga.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import _values as values
from .._clock import now_ms
from .._engine import Engine, GateOutcome
from .._protocol.codes import APPROVAL_DENIED, APPROVAL_EXPIRED
from .._protocol.kinds import awaiting_decision
from .._records import (
    ApprovalRecord,
    ApprovalState,
    Binding,
    HistoryEvent,
    OperatorAction,
    SagaRecord,
    StepRecord,
    StepState,
)
from .._scans import RecordPage, Scans
from .._sweep import Pass, PassFactory, SweepReport
from ..errors import (
    ApprovalDecisionError,
    ApprovalDenied,
    ApprovalTokenInvalid,
    ApprovalTokenReplay,
    SagaError,
    SagaNotFound,
    SagaResolutionError,
)
from ..stores.base import Fence
from .gate import OPEN_STATES, ApprovalGate, PendingApproval

__all__ = ["SagaApprovals", "SagaGates", "expiry_pass"]

logger = logging.getLogger("celery_sagas.approvals")


def _decision(record: ApprovalRecord) -> dict[str, Any]:
    return {"approval_id": record.approval_id, "decided_by": record.decided_by}


def _outcome(record: ApprovalRecord, now: int) -> GateOutcome | None:
    """What an approval record says of its gate, or None while it still waits."""
    if record.state is ApprovalState.CONSUMED:
        return GateOutcome(result=_decision(record))
    if record.state is ApprovalState.DENIED:
        return GateOutcome(failure=APPROVAL_DENIED)
    # An approved token left unused past its expiry can never be consumed: that gate
    # expired too, or the saga would wait forever.
    expired = now >= record.expires_at_ms
    if record.state is ApprovalState.EXPIRED or (
        record.state in (ApprovalState.PENDING, ApprovalState.APPROVED) and expired
    ):
        return GateOutcome(failure=APPROVAL_EXPIRED)
    return None


class SagaGates:
    """The ``Gates`` the engine consults: approval records behind gate steps."""

    def __init__(self, gate: ApprovalGate) -> None:
        self.gate = gate

    def open(self, saga_id: str, step: StepRecord) -> None:
        """Create the pending approval of a gate step before the step is recorded."""
        binding = Binding.of(step.kwargs)
        self.gate.open(
            effect_id=step.effect_id, approval_id=step.approval_id,
            capability=binding.capability, tenant_id=binding.tenant_id,
            principal_id=binding.principal_id, target=binding.target, digest=binding.digest,
            saga_id=saga_id, step=step.name,
        )

    def outcome(self, saga_id: str, gate: StepRecord, fence: Fence | None) -> GateOutcome | None:
        """What the gate's approval says now: an approved one past its expiry is expired first
        (so a consume that judged it usable a moment ago loses); a missing one (the process
        died between the gate's two writes) is opened again."""
        assert gate.approval_id is not None
        record = self.gate.get(gate.approval_id)
        if record is None:
            self.open(saga_id, gate)
            return None
        now = now_ms(self.gate.clock)
        if record.state is ApprovalState.APPROVED and now >= record.expires_at_ms:
            record = self.gate.ledger.expire(record.approval_id, fence=fence) or record
        return _outcome(record, now)


class SagaApprovals:
    """The approval gates of sagas, over the engine and an ApprovalGate (``sagas.approvals``)."""

    def __init__(self, engine: Engine, gate: ApprovalGate) -> None:
        self.engine = engine
        self.gate = gate

    def pending(self, saga_id: str) -> list[PendingApproval]:
        """The saga's gates still waiting for a decision or a token, each with its token."""
        found = []
        for step in self.engine.load(saga_id).steps:
            if not awaiting_decision(step) or step.approval_id is None:
                continue
            record = self.gate.get(step.approval_id)
            if record is not None and record.state in (ApprovalState.PENDING, ApprovalState.APPROVED):
                view = self.gate.pending(record)
                if view is not None:
                    found.append(view)
        return found

    def get(self, approval_id: str) -> ApprovalRecord | None:
        """The approval record, or None."""
        return self.gate.get(approval_id)

    def decide(self, approval_id: str, *, tenant_id: str, decision: str,
               decided_by: str, reason: str | None = None) -> ApprovalRecord:
        """Approve or deny once, while its gate still waits; a denial rolls the saga back at once.
        The decision, ``decided_by`` and the ``reason`` given go to the saga's history."""
        why = None if reason is None else values.reason(reason)
        record = self.gate.get(approval_id)
        # Only a pending approval of this tenant is judged here: any other gets the ledger's
        # own refusal (already decided, another tenant's), which says no more than it should.
        if record is not None and record.state is ApprovalState.PENDING and \
                record.tenant_id == tenant_id and record.saga_id and record.step:
            self._refuse_closed_gate(record)
        record = self.gate.decide(approval_id, tenant_id=tenant_id, decision=decision,
                                  decided_by=decided_by)
        if not (record.saga_id and record.step):
            return record
        denied = record.state is ApprovalState.DENIED
        action = OperatorAction(HistoryEvent.DENY if denied else HistoryEvent.APPROVE,
                                record.decided_by, why, step=record.step, ref=approval_id)
        if denied:
            self.engine.finish_gate(record.saga_id, record.step, record.approval_id,
                                    GateOutcome(failure=APPROVAL_DENIED), action=action)
            return record
        try:
            self.engine.record_action(record.saga_id, action)
        except SagaError:
            # The approval is decided; only its line in the saga's history is missing (the
            # gate's commit still names who approved).
            logger.warning("saga %s: approval %s recorded; its history entry was not",
                           record.saga_id, approval_id)
        return record

    def _refuse_closed_gate(self, record: ApprovalRecord) -> None:
        """ApprovalDecisionError when the approval's gate no longer waits (the saga was
        cancelled, or is gone): a decision there would change nothing but the record."""
        assert record.saga_id is not None
        saga = self.engine.get(record.saga_id)
        gate = None if saga is None else saga.step(record.step or "")
        if gate is None or gate.approval_id != record.approval_id or \
                not awaiting_decision(gate):
            why = "is gone" if saga is None else f"is {saga.state}"
            raise ApprovalDecisionError(
                f"approval {record.approval_id!r} cannot be decided: its gate no longer waits "
                f"(saga {record.saga_id!r} {why})", approval_id=record.approval_id)

    def resume(self, saga_id: str, token: object, *, tenant_id: str,
               principal_id: str) -> SagaRecord:
        """Consume an approved token for this saga's gate and let the saga go on.

        Checks in the order docs/approvals.md gives: the token's signature and expiry, the
        stored hash (``ApprovalTokenInvalid``), the binding (``ApprovalBindingError``), and only
        then the gate's and the approval's state, so none of them is told to a non-holder.
        """
        approval_id = self.gate.approval_of(token)
        step = self._gate_step(saga_id, approval_id)
        binding = Binding.of(step.kwargs)
        self.gate.check_holder(token, tenant_id=tenant_id, principal_id=principal_id,
                               capability=binding.capability, target=binding.target,
                               digest=binding.digest)
        if step.state is StepState.COMMITTED:
            raise ApprovalTokenReplay(f"approval {approval_id!r} was already used",
                                      approval_id=approval_id)
        if not awaiting_decision(step):
            # Cancelled, denied or expired: refuse without consuming the approval.
            raise ApprovalDenied(
                f"saga {saga_id!r} no longer waits at gate {step.name!r} ({step.error_code})",
                approval_id=approval_id,
            )
        consumed = self.gate.consume(
            token, tenant_id=tenant_id, principal_id=principal_id,
            capability=binding.capability, target=binding.target, digest=binding.digest,
        )
        record, changed = self.engine.finish_gate(saga_id, step.name, approval_id,
                                                  GateOutcome(result=_decision(consumed)))
        gate = record.step(step.name)
        # Only one consume succeeds, so a gate already committed was passed for this one (a
        # sweep repaired it first); any other closed gate was closed by someone else.
        if not changed and (gate is None or gate.state is not StepState.COMMITTED):
            raise ApprovalTokenReplay(f"approval {approval_id!r} was already used",
                                      approval_id=approval_id)
        return record

    def expire(self, record: ApprovalRecord, fence: Fence | None = None) -> None:
        """Expire one approval past its expiry, then settle its saga's gate as it now stands.

        ``record`` may be stale (read by a sweep): the gate follows the stored approval, so an
        approval consumed in time meanwhile passes the gate instead of failing it.
        """
        current = self.gate.ledger.expire(record.approval_id, fence=fence) or self.gate.get(
            record.approval_id)
        if current is None or not (current.saga_id and current.step):
            return
        outcome = _outcome(current, now_ms(self.gate.clock))
        if outcome is None:
            return
        try:
            self.engine.finish_gate(current.saga_id, current.step, current.approval_id, outcome,
                                    fence)
        except (SagaResolutionError, SagaNotFound):
            # No gate holds it: the write that recorded its step lost a race and the retry
            # opened another approval, or its saga is gone. Expiring it was all.
            return

    def _gate_step(self, saga_id: str, approval_id: str) -> StepRecord:
        for step in self.engine.load(saga_id).steps:
            if step.approval_id == approval_id:
                return step
        raise ApprovalTokenInvalid("the token does not belong to this saga")


def expiry_pass(approvals: SagaApprovals) -> PassFactory:
    """A sweep pass factory: pending or approved (unused) approvals past their expiry are
    expired, and the gates still waiting on them failed; an approval no live gate holds (its
    saga cancelled or gone) ends ``expired`` too."""

    def make(engine: Engine, scans: Scans, now: int) -> Pass[ApprovalRecord]:
        def fetch(bucket: int, cursor: str | None, limit: int) -> RecordPage[ApprovalRecord]:
            return scans.approvals(OPEN_STATES, bucket=bucket, cursor=cursor, limit=limit)

        def act(record: ApprovalRecord, fence: Fence, report: SweepReport) -> None:
            if now >= record.expires_at_ms:
                approvals.expire(record, fence)
                report.acted += 1

        return Pass("approvals:pending", fetch, act)

    return make
