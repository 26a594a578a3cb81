"""Retention: the sweep pass that archives and deletes final sagas past retention (docs/design.md §7).

The pass scans the final states' indexes (``completed``, ``compensated``) of one bucket for
sagas not updated since ``now - retention``, so its cost follows what it deletes, never what is
kept. For each saga it reads:

1. the ``archive`` callable, when configured, receives the record, its history ending with an
   ``archived`` entry (docs/design.md §2.6); if it raises, the record is
   kept (deleted by a later sweep once the archive works), an ERROR line names the saga and a
   finding of kind ``archive_failed`` is reported;
2. a child saga whose parent is still open is kept: the parent may yet compensate it;
3. the approvals the saga owns (its gate steps' approval records, in its bucket) and then the
   saga record are deleted, each at the version read, with the sweep's fence: a saga written
   meanwhile (a signal noted on it) is left for the next sweep.

The deletes of a page go to the store as one batch once the page's records were archived
(``delete_all``: one transaction on SQL; one atomic script per record on Redis). An approval
comes before its saga, so a crash in between leaves a final saga whose approvals are gone
(harmless: nothing of a final saga waits on one), never an approval nobody owns. The archive
runs at least once per deleted saga: a crash between the archive call and the delete calls it
again in the next sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ._engine import Engine
from ._protocol.findings import Finding, FindingKind
from ._protocol.history import archived
from ._records import APPROVAL, SAGA, ApprovalRecord, ApprovalState, SagaRecord, SagaState
from ._scans import RecordPage, Scans
from ._sweep import Pass, PassFactory, SweepReport
from .errors import InvalidRecordError, SagaError
from .stores.base import Fence, delete_all

__all__ = ["FINAL_APPROVAL_STATES", "FINAL_STATES", "Archive", "approval_retention_pass",
           "retention_pass"]

logger = logging.getLogger("celery_sagas.retention")

FINAL_STATES = (SagaState.COMPLETED, SagaState.COMPENSATED)
FINAL_APPROVAL_STATES = (ApprovalState.DENIED, ApprovalState.CONSUMED, ApprovalState.EXPIRED)

Archive = Callable[[SagaRecord], Any]


def retention_pass(retention_ms: int, archive: Archive | None = None) -> PassFactory:
    """A sweep pass factory: final sagas not updated for ``retention_ms`` are archived, then
    deleted with the approvals they own."""

    def make(engine: Engine, scans: Scans, now: int) -> Pass[SagaRecord]:
        before = now - retention_ms

        def fetch(bucket: int, cursor: str | None, limit: int) -> RecordPage[SagaRecord]:
            if before <= 0:  # a retention longer than the epoch: nothing can be due
                return RecordPage((), (), None)
            return scans.sagas(list(FINAL_STATES), updated_before_ms=before, bucket=bucket,
                               cursor=cursor, limit=limit)

        batch: list[tuple[str, str, int]] = []  # what the page's records let go, in order

        def act(record: SagaRecord, fence: Fence, report: SweepReport) -> None:
            if record.state not in FINAL_STATES or record.updated_at_ms >= before:
                return  # never delete what is not final and due, whatever a scan returned
            if _parent_open(scans, record):
                return  # the parent may still compensate this child as a unit (§3.7)
            if archive is not None and not _archived(archive, archived(record, now), report):
                return
            for approval_id in _owned_approvals(record):
                envelope = scans.store.get(APPROVAL, approval_id)
                if envelope is not None:
                    batch.append((APPROVAL, approval_id, envelope.version))
            batch.append((SAGA, record.saga_id, record.version))

        def settle(fence: Fence, report: SweepReport) -> None:
            items = batch[:]
            batch.clear()
            if not items:
                return
            done = delete_all(scans.store, items, fence=fence)
            deleted = sum(1 for (kind, _, _), ok in zip(items, done, strict=True)
                          if ok and kind == SAGA)
            report.acted += deleted
            report.deleted += deleted

        return Pass("sagas:retention", fetch, act, settle)

    return make


def _archived(archive: Archive, record: SagaRecord, report: SweepReport) -> bool:
    """Hand the record to the archive; on failure report it and say to keep the record."""
    try:
        archive(record)
    except Exception as exc:
        # The exception's text may quote the record's payload: log its type only.
        logger.error("archive failed for saga %s (%s): kept, retried by the next sweep",
                     record.saga_id, type(exc).__name__,
                     extra={"saga_id": record.saga_id, "error_type": type(exc).__name__})
        report.errors += 1
        report.findings.append(Finding(
            FindingKind.ARCHIVE_FAILED, SAGA, record.saga_id, str(record.state),
            reason=f"archive raised {type(exc).__name__}", updated_at_ms=record.updated_at_ms,
        ))
        return False
    return True


def _parent_open(scans: Scans, record: SagaRecord) -> bool:
    """Whether ``record`` is a child saga whose parent is not final (or cannot be read)."""
    if record.parent is None:
        return False
    envelope = scans.store.get(SAGA, record.parent.saga_id)
    if envelope is None:
        return False
    try:
        parent = scans.codec.saga(envelope, record.parent.saga_id)
    except SagaError:
        return True
    return parent.state not in FINAL_STATES


def _owned_approvals(record: SagaRecord) -> list[str]:
    return [step.approval_id for step in record.steps if step.approval_id is not None]


def approval_retention_pass(retention_ms: int) -> PassFactory:
    """A sweep pass factory: decided approvals past retention that no saga owns any more.

    A saga's approvals go with the saga (``retention_pass``). This pass deletes the rest once
    they are final (denied, consumed, expired) and older than ``retention_ms``: an approval
    whose saga is gone, one of no saga, and one that a lost race opened and no step records.
    An approval its saga still records is kept for the saga's own deletion.
    """

    def make(engine: Engine, scans: Scans, now: int) -> Pass[ApprovalRecord]:
        before = now - retention_ms

        def fetch(bucket: int, cursor: str | None, limit: int) -> RecordPage[ApprovalRecord]:
            if before <= 0:
                return RecordPage((), (), None)
            return scans.approvals(list(FINAL_APPROVAL_STATES), updated_before_ms=before,
                                   bucket=bucket, cursor=cursor, limit=limit)

        batch: list[tuple[str, str, int]] = []

        def act(record: ApprovalRecord, fence: Fence, report: SweepReport) -> None:
            if record.state in FINAL_APPROVAL_STATES and record.updated_at_ms < before \
                    and not _owned(scans, record):
                batch.append((APPROVAL, record.approval_id, record.version))

        def settle(fence: Fence, report: SweepReport) -> None:
            items = batch[:]
            batch.clear()
            if items:
                report.acted += sum(delete_all(scans.store, items, fence=fence))

        return Pass("approvals:retention", fetch, act, settle)

    return make


def _owned(scans: Scans, approval: ApprovalRecord) -> bool:
    """Whether the approval's saga exists and records it (or cannot be read: keep it then)."""
    if approval.saga_id is None:
        return False
    envelope = scans.store.get(SAGA, approval.saga_id)
    if envelope is None:
        return False
    try:
        saga = scans.codec.saga(envelope, approval.saga_id)
    except InvalidRecordError:
        return True
    return approval.approval_id in _owned_approvals(saga)
