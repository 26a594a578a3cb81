"""Approval gates inside sagas: ``sagas.approvals`` (SPEC §4, "In a saga").

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
between, the sweep's ``reconcile`` brings the gate step in line with its approval record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._events import Phase, Stage
from .._protocol import codes, moves
from .._records import ApprovalRecord, ApprovalState, SagaRecord, StepRecord, StepState
from .._scans import RecordPage, scan_approvals
from .._sweep import Pass, SweepReport
from ..errors import (
    ApprovalDenied,
    ApprovalTokenInvalid,
    ApprovalTokenReplay,
    SagaConcurrencyError,
    SagaResolutionError,
)
from ..stores.base import Fence
from .gate import ApprovalGate, PendingApproval
from .ledger import expire

if TYPE_CHECKING:
    from .._engine import Engine

__all__ = ["SagaApprovals", "approval_expiry_pass"]


def _decision(record: ApprovalRecord) -> dict[str, Any]:
    return {"approval_id": record.approval_id, "decided_by": record.decided_by}


class SagaApprovals:
    """The approval gates of sagas, over the engine and an ApprovalGate."""

    def __init__(self, engine: Callable[[], Engine], gate: Callable[[], ApprovalGate]) -> None:
        self._engine = engine
        self._gate = gate

    @property
    def gate(self) -> ApprovalGate:
        """The coordinator (also usable on its own, outside sagas)."""
        return self._gate()

    def pending(self, saga_id: str) -> list[PendingApproval]:
        """The saga's gates still waiting for a decision or a token, each with its token."""
        found = []
        for step in self._engine().load(saga_id).steps:
            if step.state is not StepState.AWAITING_APPROVAL or step.approval_id is None:
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
               decided_by: str) -> ApprovalRecord:
        """Approve or deny once; a denial rolls the saga back at once."""
        record = self.gate.decide(approval_id, tenant_id=tenant_id, decision=decision,
                                  decided_by=decided_by)
        if record.state is ApprovalState.DENIED and record.saga_id and record.step:
            self._settle(record.saga_id, record.step, record.approval_id, None,
                         codes.APPROVAL_DENIED)
        return record

    def resume(self, saga_id: str, token: object, *, tenant_id: str,
               principal_id: str) -> SagaRecord:
        """Consume an approved token for this saga's gate and let the saga go on."""
        approval_id = self.gate.approval_of(token)
        step = self._gate_step(saga_id, approval_id)
        if step.state is StepState.COMMITTED:
            raise ApprovalTokenReplay(f"approval {approval_id!r} was already used",
                                      approval_id=approval_id)
        if step.state is not StepState.AWAITING_APPROVAL:
            # Cancelled, denied or expired: refuse without consuming the approval.
            raise ApprovalDenied(
                f"saga {saga_id!r} no longer waits at gate {step.name!r} ({step.error_code})",
                approval_id=approval_id,
            )
        binding = step.kwargs
        consumed = self.gate.consume(
            token, tenant_id=tenant_id, principal_id=principal_id,
            capability=binding["capability"], target=binding.get("target"),
            digest=binding.get("digest"),
        )
        record, changed = self._settle(saga_id, step.name, approval_id, _decision(consumed), None)
        gate = record.step(step.name)
        # Only one consume succeeds, so a gate already committed was passed for this one (a
        # sweep repaired it first); any other closed gate was closed by someone else.
        if not changed and (gate is None or gate.state is not StepState.COMMITTED):
            raise ApprovalTokenReplay(f"approval {approval_id!r} was already used",
                                      approval_id=approval_id)
        return record

    def reconcile(self, saga: SagaRecord, fence: Fence | None = None) -> SagaRecord:
        """Bring every gate of ``saga`` in line with its approval record (sweep repair)."""
        for step in saga.steps:
            if step.state is not StepState.AWAITING_APPROVAL or step.approval_id is None:
                continue
            record = self.gate.get(step.approval_id)
            if record is None:
                self._reopen(saga, step)
                continue
            if self._due(record):
                record = self._expired(record.approval_id, fence)
            outcome = None if record is None else self._outcome(record)
            if record is not None and outcome is not None:
                saga, _ = self._settle(saga.saga_id, step.name, record.approval_id, *outcome,
                                       fence=fence)
        return saga

    def expire(self, record: ApprovalRecord, fence: Fence | None = None) -> None:
        """Expire one approval past its expiry, then settle its saga's gate as it now stands.

        ``record`` may be stale (read by a sweep): the gate follows the stored approval, so an
        approval consumed in time meanwhile passes the gate instead of failing it.
        """
        current = self._expired(record.approval_id, fence)
        if current is None or not (current.saga_id and current.step):
            return
        outcome = self._outcome(current)
        if outcome is None:
            return
        try:
            self._settle(current.saga_id, current.step, current.approval_id, *outcome,
                         fence=fence)
        except SagaResolutionError:
            # No gate holds it: the write that recorded its step lost a race and the retry
            # opened another approval. Nothing waits on this one; expiring it was all.
            return

    # ------------------------------------------------------------ internals

    def _due(self, record: ApprovalRecord) -> bool:
        # An approved approval can be consumed, so its expiry is written before its gate fails
        # (a consume that judged it usable a moment ago then loses). A pending one cannot; the
        # approvals pass of the same sweep writes its expiry (and counts it).
        approved = record.state is ApprovalState.APPROVED
        return approved and self._engine().now() >= record.expires_at_ms

    def _expired(self, approval_id: str, fence: Fence | None) -> ApprovalRecord | None:
        """Write the expiry of an unused approval past it (the approval first, the saga
        second; both fenced for a sweep), then return the approval as stored."""
        moved = expire(self.gate.store, self.gate.clock, approval_id, fence=fence)
        return moved if moved is not None else self.gate.get(approval_id)

    def _outcome(self, record: ApprovalRecord) -> tuple[dict[str, Any] | None, str | None] | None:
        if record.state is ApprovalState.CONSUMED:
            return _decision(record), None
        if record.state is ApprovalState.DENIED:
            return None, codes.APPROVAL_DENIED
        # An approved token left unused past its expiry can never be consumed: that gate
        # expired too, or the saga would wait forever.
        expired = self._engine().now() >= record.expires_at_ms
        if record.state is ApprovalState.EXPIRED or (
            record.state in (ApprovalState.PENDING, ApprovalState.APPROVED) and expired
        ):
            return None, codes.APPROVAL_EXPIRED
        return None

    def _reopen(self, saga: SagaRecord, step: StepRecord) -> None:
        binding = step.kwargs
        self.gate.open(
            effect_id=step.effect_id, approval_id=step.approval_id,
            capability=binding["capability"], tenant_id=binding["tenant_id"],
            principal_id=binding["principal_id"], target=binding.get("target"),
            digest=binding.get("digest"), saga_id=saga.saga_id, step=step.name,
        )

    def _gate_step(self, saga_id: str, approval_id: str) -> StepRecord:
        for step in self._engine().load(saga_id).steps:
            if step.approval_id == approval_id:
                return step
        raise ApprovalTokenInvalid("the token does not belong to this saga")

    def _settle(self, saga_id: str, name: str, approval_id: str, result: dict[str, Any] | None,
                failure: str | None, fence: Fence | None = None) -> tuple[SagaRecord, bool]:
        """Pass (result) or fail (failure code) a gate step; (record, whether this call did it)."""
        engine = self._engine()
        for _ in range(engine.settings.max_races):
            saga = engine.load(saga_id)
            step = saga.step(name)
            if step is None or step.approval_id != approval_id:
                raise SagaResolutionError(f"saga {saga_id!r} has no gate {name!r} for that approval")
            if step.state is not StepState.AWAITING_APPROVAL:
                return saga, False
            now = engine.now()
            if failure is None:
                after = moves.pass_gate(saga, name, approval_id, result, now)
            else:
                after = moves.fail_gate(saga, name, approval_id, failure, now)
            try:
                written = engine.write(saga, after, fence)
            except SagaConcurrencyError:
                continue
            phase = Phase.COMMITTED if failure is None else Phase.FAILED
            engine.emit(written, step, Stage.EXECUTION, phase, failure)
            return engine.advance(saga_id, written, fence), True
        raise SagaConcurrencyError(f"saga {saga_id!r} kept changing; gate not settled")


def approval_expiry_pass(engine: Engine, approvals: SagaApprovals) -> Pass:
    """A sweep pass over pending approvals: those past expiry are expired, gates failed."""
    now = engine.now()

    def fetch(cursor: str | None, limit: int) -> RecordPage[object]:
        page = scan_approvals(engine.store, [ApprovalState.PENDING], cursor=cursor, limit=limit)
        return RecordPage(tuple(page.records), page.corrupt, page.cursor)

    def act(record: object, fence: Fence, report: SweepReport) -> None:
        assert isinstance(record, ApprovalRecord)
        if now >= record.expires_at_ms:
            approvals.expire(record, fence)
            report.acted += 1

    return Pass("approvals:pending", fetch, act)
