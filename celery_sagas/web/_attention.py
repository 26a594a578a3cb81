"""What needs a human, and what only waits: the overview's figure and the attention page's lists.

"Needs an operator" is every saga in manual review plus every open saga not updated for
``stale_after`` that the findings judge stale (docs/design.md §6); an open saga held by a
timer, a signal wait, a child saga or an approval gate whose time has not passed is *waiting*,
shown apart with what it waits for and until when. Telling the two apart means reading the
open sagas not updated for ``stale_after`` (an index-backed scan of those only); the overview
reads at most ``STALE_READ`` of them and says "at least" beyond.

Pending approvals whose gate no longer waits (the saga was cancelled, or is gone) are left out
of the queue and of its count: no decision can change anything there, and the sweep expires
them when their time comes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from celery_sagas import ApprovalRecord, ApprovalState, SagaRecord, SagaState

from .._protocol.findings import holds, saga_finding
from .._protocol.kinds import awaiting_decision, kind_of
from .._records import StepRecord
from .._scans import Scans

__all__ = ["STALE_READ", "Attention", "Wait", "WaitingRow", "judge_stale", "live_gate", "waiting_rows",
           "waits_of"]

STALE_READ = 500  # open sagas past stale_after the overview reads to tell waits from stale
OPEN = (SagaState.RUNNING, SagaState.COMPENSATING)


@dataclass(frozen=True, slots=True)
class Wait:
    """What a step holding its saga waits for: ``kind`` is timer, signal, child or approval;
    ``what`` names it (the signal, the child saga, the approval); ``until_ms`` is when the wait
    ends by itself (a timer's wake-up, a signal wait's timeout), None for never."""

    step: str
    kind: str
    what: str | None
    until_ms: int | None


def waits_of(record: SagaRecord) -> list[Wait]:
    """The waits of the steps holding ``record`` now (none once it is final)."""
    if record.state.final:
        return []
    return [wait for step in record.steps if (wait := _wait(step)) is not None]


def _wait(step: StepRecord) -> Wait | None:
    """What a held step waits for, as its kind says (docs/design.md §3.11); None for any other."""
    kind = kind_of(step)
    if not kind.held or step.state is not kind.held_state:
        return None
    return Wait(step.name, kind.name, kind.waits_for(step), step.wake_at_ms)


@dataclass(frozen=True, slots=True)
class WaitingRow:
    """An open saga not updated for ``stale_after`` that waits by design, and for what."""

    saga_id: str
    definition: str
    updated_at_ms: int
    waits: tuple[Wait, ...]


@dataclass(frozen=True, slots=True)
class Attention:
    """Sagas needing an operator (manual review, plus stale ones) and those only waiting.

    ``exact`` is False when there were more open sagas past ``stale_after`` than one request
    reads: ``stale`` and ``waiting`` are then lower bounds."""

    manual_review: int
    stale: int
    waiting: int = 0
    exact: bool = True

    @property
    def total(self) -> int:
        """Manual review and stale together."""
        return self.manual_review + self.stale


def judge_stale(scans: Scans, stale_before_ms: int, manual_review: int) -> Attention:
    """Read up to ``STALE_READ`` open sagas past ``stale_before_ms``; count the stale and the
    waiting ones (corrupt records count as stale: someone must look at them)."""
    stale = waiting = read = 0
    cursor: str | None = None
    while read < STALE_READ:
        page = scans.sagas(list(OPEN), updated_before_ms=stale_before_ms, cursor=cursor,
                           limit=min(250, STALE_READ - read))
        read += len(page.records) + len(page.corrupt)
        stale += len(page.corrupt)
        for record in page.records:
            if saga_finding(record, stale_before_ms) is None:
                waiting += 1
            else:
                stale += 1
        cursor = page.cursor
        if cursor is None:
            return Attention(manual_review, stale, waiting)
    return Attention(manual_review, stale, waiting, exact=False)


def waiting_rows(scans: Scans, stale_before_ms: int, limit: int) -> list[WaitingRow]:
    """Up to ``limit`` open sagas past ``stale_before_ms`` that wait by design, oldest first
    (reading at most ``STALE_READ``)."""
    rows: list[WaitingRow] = []
    cursor: str | None = None
    read = 0
    while len(rows) < limit and read < STALE_READ:
        page = scans.sagas(list(OPEN), updated_before_ms=stale_before_ms, cursor=cursor,
                           limit=min(250, STALE_READ - read))
        read += len(page.records) + len(page.corrupt)
        rows += [WaitingRow(r.saga_id, r.definition, r.updated_at_ms, tuple(waits_of(r)))
                 for r in page.records
                 if any(holds(s, stale_before_ms) for s in r.steps)][:limit - len(rows)]
        cursor = page.cursor
        if cursor is None:
            break
    return sorted(rows, key=lambda row: row.updated_at_ms)


def live_gate(approval: ApprovalRecord, load: Callable[[str], SagaRecord | None]) -> bool:
    """True when a pending approval's gate still waits for it (or it belongs to no saga)."""
    if approval.state is not ApprovalState.PENDING or not approval.saga_id:
        return approval.state is ApprovalState.PENDING
    saga = load(approval.saga_id)
    gate = None if saga is None else saga.step(approval.step or "")
    return gate is not None and gate.approval_id == approval.approval_id and \
        awaiting_decision(gate)
