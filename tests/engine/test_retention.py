"""Retention and archival (docs/design.md §7): the sweep's retention pass, in-process.

Sagas final (completed, compensated) for longer than ``retention`` are handed to ``archive``
and deleted with the approvals they own; running, compensating and manual-review sagas are
never deleted, whatever their age. A raising archive keeps the record, logs an ERROR and is
reported as an ``archive_failed`` finding.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas, StepNotCommitted
from celery_sagas._approvals.ledger import ApprovalLedger
from celery_sagas._events import FindingEvent
from celery_sagas._records import APPROVAL, Binding, SagaRecord, SagaState
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import ORDER, Script, Shop, register_shop

RETENTION_S = 3600
RETENTION_MS = RETENTION_S * 1000
SECRET = "approval-secret-for-engine-tests!"
BINDING: dict[str, str] = {"tenant_id": "t1", "principal_id": "alice"}


class Archive:
    """An archive that records what it received and raises while told to."""

    def __init__(self) -> None:
        self.received: list[SagaRecord] = []
        self.failing = False
        self.hooks: list[Any] = []  # each called once, on the next record received

    def __call__(self, record: SagaRecord) -> None:
        if self.failing:
            raise RuntimeError(f"archive down (input {record.input!r})")
        self.received.append(record)
        while self.hooks:
            self.hooks.pop(0)(record)


@pytest.fixture
def archive() -> Archive:
    return Archive()


@pytest.fixture
def sagas(app: Celery, store: MemoryStore, clock: FrozenClock, archive: Archive) -> Sagas:
    """Sagas with a one-hour retention, an archive and approvals (overrides the conftest's)."""
    return Sagas(app, store=store, allow_non_durable=True, clock=clock, retention=RETENTION_S,
                 archive=archive, approval_secrets=[SECRET])


def finished(shop: Shop, saga_id: str, state: SagaState) -> SagaRecord:
    """Run an order to the end: completed, or compensated (its ship declined)."""
    if state is SagaState.COMPENSATED:
        shop.script.then("ship", StepNotCommitted("out_of_stock"))
    shop.start_order(saga_id)
    shop.driver.run_until_idle()
    record = shop.record(saga_id)
    assert record.state is state
    return record


def completed(shop: Shop, saga_id: str) -> SagaRecord:
    return finished(shop, saga_id, SagaState.COMPLETED)


def compensated(shop: Shop, saga_id: str) -> SagaRecord:
    return finished(shop, saga_id, SagaState.COMPENSATED)


def in_manual_review(shop: Shop, saga_id: str) -> SagaRecord:
    shop.script.then("refund", RuntimeError("refund down"), RuntimeError("refund down"),
                     RuntimeError("refund down"))
    shop.script.then("ship", StepNotCommitted("out_of_stock"))
    shop.start_order(saga_id)
    for _ in range(10):
        shop.driver.run_until_idle()
        shop.clock.advance(60_000)
        shop.sagas.sweep()
        if shop.record(saga_id).state is SagaState.MANUAL_REVIEW:
            break
    record = shop.record(saga_id)
    assert record.state is SagaState.MANUAL_REVIEW
    return record


def findings_of(shop: Shop) -> list[FindingEvent]:
    seen: list[FindingEvent] = []
    shop.sagas.subscribe_findings(seen.append)
    return seen


def test_only_final_sagas_past_retention_are_archived_then_deleted(shop: Shop, archive: Archive) -> None:
    # given: a completed and a compensated saga past retention, one in manual review and one
    # running (its step message lost) just as old, and a completed saga still within retention
    old_done, old_undone = completed(shop, "old-done"), compensated(shop, "old-undone")
    review = in_manual_review(shop, "review")
    shop.start_order("running")
    shop.driver.take()
    shop.clock.advance(RETENTION_MS + 1)
    young = completed(shop, "young")

    # when
    report = shop.sagas.sweep()

    # then
    assert report.deleted == 2 and report.complete
    assert sorted(r.saga_id for r in archive.received) == ["old-done", "old-undone"]
    archived = {r.saga_id: r for r in archive.received}["old-done"]
    assert replace(archived, history=archived.history[:-1]) == old_done
    assert (archived.history[-1].event, archived.history[-1].at_ms) == ("archived", shop.clock.now_ms())
    assert shop.sagas.get("old-done") is None and shop.sagas.get("old-undone") is None
    assert shop.record("review").state is SagaState.MANUAL_REVIEW
    assert shop.record("review").version >= review.version
    assert shop.record("running").state is SagaState.RUNNING
    assert shop.record("young") == young
    assert old_undone.state is SagaState.COMPENSATED

    # and: the young one goes once it is past retention too; each saga was archived once
    shop.clock.advance(RETENTION_MS + 1)
    shop.sagas.sweep()
    shop.sagas.sweep()
    assert shop.sagas.get("young") is None
    assert sorted(r.saga_id for r in archive.received) == ["old-done", "old-undone", "young"]
    assert shop.sagas.get("review") is not None


def test_a_raising_archive_keeps_the_record_logs_an_error_and_reports_it(
    shop: Shop, archive: Archive, caplog: pytest.LogCaptureFixture
) -> None:
    # given
    completed(shop, "kept")
    shop.clock.advance(RETENTION_MS + 1)
    archive.failing = True
    seen = findings_of(shop)

    # when
    with caplog.at_level(logging.ERROR, logger="celery_sagas"):
        report = shop.sagas.sweep()

    # then: kept, an ERROR naming the saga (never the payload), an archive_failed finding
    assert shop.sagas.get("kept") is not None and report.deleted == 0
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any("kept" in r.getMessage() and "RuntimeError" in r.getMessage() for r in errors)
    assert all(ORDER["card"] not in r.getMessage() for r in caplog.records)
    assert [(f.kind, f.record_id) for f in seen] == [("archive_failed", "kept")]

    # and: once the archive works again the next sweep archives and deletes it
    archive.failing = False
    assert shop.sagas.sweep().deleted == 1
    assert shop.sagas.get("kept") is None
    assert [r.saga_id for r in archive.received] == ["kept"]


def test_the_approvals_a_saga_owns_are_deleted_with_it(shop: Shop, archive: Archive) -> None:
    # given: a gated saga denied by the manager, so it compensates
    tasks = shop.tasks

    @shop.sagas.saga("gated-order")
    def gated_order(ctx: Any, order: dict[str, Any]) -> Any:
        ctx.step(tasks["reserve"], order["sku"], order["qty"])
        return ctx.approval("manager", capability="orders.approve", target=order["id"], **BINDING)

    gated_order.start(ORDER, saga_id="gated")
    shop.driver.run_until_idle()
    [pending] = shop.sagas.approvals.pending("gated")
    shop.sagas.approvals.decide(pending.approval_id, tenant_id="t1", decision="denied",
                                decided_by="bob")
    shop.driver.run_until_idle()
    assert shop.record("gated").state is SagaState.COMPENSATED
    other = completed(shop, "other")
    shop.clock.advance(RETENTION_MS + 1)

    # when
    report = shop.sagas.sweep()

    # then
    assert report.deleted == 2
    assert shop.sagas.store.get(APPROVAL, pending.approval_id) is None
    assert shop.sagas.get("gated") is None and shop.sagas.get(other.saga_id) is None


def test_a_saga_written_after_the_scan_is_left_for_the_next_sweep(
    shop: Shop, store: MemoryStore, archive: Archive
) -> None:
    # given: another writer rewrites the final saga while the archive holds it (its version moves)
    completed(shop, "rewritten")
    shop.clock.advance(RETENTION_MS + 1)

    def rewrite(record: SagaRecord) -> None:
        stored = store.get("saga", record.saga_id)
        assert stored is not None
        assert store.compare_and_set(replace(stored, version=stored.version + 1), stored.version)

    archive.hooks.append(rewrite)

    # when / then: the delete at the version read is refused; the next sweep deletes it
    assert shop.sagas.sweep().deleted == 0
    assert store.get("saga", "rewritten") is not None
    assert shop.sagas.sweep().deleted == 1
    assert [r.saga_id for r in archive.received] == ["rewritten", "rewritten"]


def test_without_retention_nothing_is_ever_deleted(app: Celery, store: MemoryStore,
                                                   clock: FrozenClock) -> None:
    # given
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock, retention=None)
    register_shop(sagas, Script())
    sagas.start("place-order", ORDER, saga_id="forever")
    SagaDriver(sagas).run_until_idle()
    clock.advance(10 * 365 * 24 * 3600 * 1000)

    # when
    report = sagas.sweep()

    # then
    assert report.deleted == 0
    assert sagas.get("forever") is not None


def test_decided_approvals_no_saga_owns_go_after_retention_and_owned_ones_stay(
    shop: Shop, store: MemoryStore, clock: FrozenClock
) -> None:
    # given: an approval consumed by a gate of a saga still running (owned), and two
    # decided approvals nobody owns: one of a saga that is gone, one of no saga at all
    tasks = shop.tasks

    @shop.sagas.saga("gated-order")
    def gated_order(ctx: Any, order: dict[str, Any]) -> Any:
        ctx.approval("manager", capability="orders.approve", target=order["id"], **BINDING)
        return ctx.step(tasks["reserve"], order["sku"], order["qty"])

    gated_order.start(ORDER, saga_id="gated")
    shop.driver.run_until_idle()
    [pending] = shop.sagas.approvals.pending("gated")
    shop.sagas.approvals.decide(pending.approval_id, tenant_id="t1", decision="approved",
                                decided_by="bob")
    shop.sagas.approvals.resume("gated", pending.token, **BINDING)
    shop.driver.take()  # reserve is never delivered: the saga stays running
    ledger = ApprovalLedger(store, clock)
    for approval_id, saga_id in (("orphan-of-gone", "gone"), ("orphan-of-none", None)):
        ledger.create(approval_id=approval_id, effect_id=f"e-{approval_id}",
                      binding=Binding("orders.approve", "t1", "alice"), token_hash="a" * 64,
                      ttl_ms=60_000, saga_id=saga_id, step="manager" if saga_id else None)
        ledger.decide(approval_id, tenant_id="t1", decision="denied", decided_by="bob")
    clock.advance(RETENTION_MS + 1)

    # when
    shop.sagas.sweep()

    # then
    assert store.get(APPROVAL, "orphan-of-gone") is None
    assert store.get(APPROVAL, "orphan-of-none") is None
    assert store.get(APPROVAL, pending.approval_id) is not None
    assert shop.record("gated").state is SagaState.RUNNING


def test_a_completed_child_outlives_retention_while_its_parent_is_open(shop: Shop) -> None:
    # given: a parent whose child completed, then the parent sleeps past the retention
    charge = shop.tasks["charge"]

    @shop.sagas.saga("payment")
    def payment(ctx: Any, data: dict[str, Any]) -> Any:
        return ctx.step(charge, data["card"], 10)

    @shop.sagas.saga("long-trip")
    def long_trip(ctx: Any, data: dict[str, Any]) -> Any:
        paid = ctx.child(payment, {"card": "visa"})
        ctx.sleep(2 * RETENTION_S)
        return paid

    long_trip.start({}, saga_id="lt-1")
    shop.driver.run_until_idle()
    [child_id] = [s.kwargs["saga_id"] for s in shop.record("lt-1").steps if s.task.endswith("child")]
    assert shop.record(child_id).state is SagaState.COMPLETED

    # when: the retention passes while the parent still sleeps
    shop.clock.advance(RETENTION_MS + 60_000)
    shop.sagas.sweep()

    # then: the parent may still compensate its child as a unit, so the child is kept
    assert shop.record("lt-1").state is SagaState.RUNNING
    assert shop.sagas.get(child_id) is not None

    # and once the parent is final and past retention too, both go
    shop.clock.advance(2 * RETENTION_MS)
    shop.sagas.sweep()
    shop.driver.run_until_idle()
    assert shop.record("lt-1").state is SagaState.COMPLETED
    shop.clock.advance(RETENTION_MS + 60_000)
    shop.sagas.sweep()
    shop.sagas.sweep()
    assert shop.sagas.get(child_id) is None and shop.sagas.get("lt-1") is None
