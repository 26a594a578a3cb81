"""The sweep (SPEC §5): each finding reported once and only for an operator, every corrupt
record reported, the lease freed whatever fails after it was granted, no endless walk."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import pytest

from celery_sagas import MemoryStore
from celery_sagas._findings import page_findings, window_of
from celery_sagas._leases import Leases
from celery_sagas._records import SagaState
from celery_sagas._scans import RecordPage, scan_sagas
from celery_sagas._sweep import SWEEP_LEASE, Pass, SweepReport, sweep
from celery_sagas._wakeups import WAKEUP
from celery_sagas.errors import SagaValidationError, StoreError
from celery_sagas.stores.base import Envelope, Fence, Lease, Page
from tests.engine.conftest import Shop


def test_a_compensation_just_dispatched_is_not_reported_as_a_finding(shop: Shop) -> None:
    # given: ship declined, charge's refund sent a moment ago (in flight, not stale)
    shop.refund_pending()
    assert shop.record().state == SagaState.COMPENSATING

    # when
    report = shop.sagas.sweep()

    # then: nothing needs an operator, as the findings pages say too
    assert report.findings == []
    assert page_findings(shop.sagas.store, window_of(shop.sagas.engine)).findings == ()


def test_a_stale_compensation_in_flight_is_still_reported(shop: Shop) -> None:
    # given: the refund sent long ago and never heard of since
    shop.refund_pending()

    # when
    report = shop.sweep_when_stale()

    # then
    sagas = [(str(f.kind), f.record_id) for f in report.findings if f.record_kind == "saga"]
    assert sagas == [("ambiguous-compensation", "o-1")]


def test_a_saga_the_sweep_sends_to_manual_review_is_reported_once(shop: Shop) -> None:
    # given: reserve claimed on another host, silent past its time limit and grace
    shop.start_order()
    shop.driver.take()
    shop.claim_as("elsewhere:1/ab", "shop.reserve")
    timing = shop.sagas.settings.timing
    shop.clock.advance(max(timing.stale_ms, timing.default_time_limit_ms + timing.grace_ms) + 1)
    seen: list[Any] = []
    shop.sagas.subscribe_findings(seen.append)

    # when
    report = shop.sagas.sweep()

    # then: the running pass sent it to manual review, the manual-review pass reported it
    assert shop.record().state == SagaState.MANUAL_REVIEW
    assert [(str(f.kind), f.record_id) for f in report.findings] == [("ambiguous-execution", "o-1")]
    assert [(e.kind, e.record_id) for e in seen] == [("ambiguous-execution", "o-1")]


def test_a_corrupt_wakeup_is_reported_and_the_sweep_goes_on(shop: Shop, store: MemoryStore) -> None:
    # given: a due wake-up whose body is garbage, and one that names no valid saga id
    now = shop.clock.now_ms()
    assert store.create(Envelope(WAKEUP, "w-1", 1, "due", now - 1, "{garbage"))
    assert store.create(Envelope(WAKEUP, "w-2", 1, "due", now - 1,
                                 '{"saga_id": "no spaces allowed", "created_at_ms": 0}'))

    # when
    first = shop.sagas.sweep()
    second = shop.sagas.sweep()

    # then: reported every time, never acted on, nothing else disturbed
    for report in (first, second):
        assert sorted((c.kind, c.id) for c in report.corrupt) == [(WAKEUP, "w-1"), (WAKEUP, "w-2")]
        assert report.complete and report.errors == 0


def test_the_lease_is_released_when_counting_sagas_fails(
    shop: Shop, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: the store fails the gauge's counting scans (asked with the cap as their limit)
    real = store.scan

    def scan(kind: str, states: Sequence[str], **options: Any) -> Page:
        if options.get("limit") == 7:
            raise StoreError("store went away")
        return real(kind, states, **options)

    monkeypatch.setattr(store, "scan", scan)

    # when
    with pytest.raises(StoreError):
        sweep(shop.sagas.engine, owner="beat-1", lease_ms=60_000, count_cap=7)

    # then: the next sweeper need not wait for the lease to expire
    assert Leases(store, shop.clock, owner="beat-2").acquire(SWEEP_LEASE, 60_000) is not None


def test_a_cursor_the_store_refuses_mid_walk_stops_the_sweep_instead_of_looping(
    shop: Shop, store: MemoryStore
) -> None:
    # given: two running sagas, and a pass whose store refuses its own next-page cursor
    for saga_id in ("o-1", "o-2"):
        shop.start_order(saga_id)
    shop.driver.take()

    def fetch(cursor: str | None, limit: int) -> RecordPage[object]:
        if cursor is not None:
            raise SagaValidationError("malformed scan cursor")
        page = scan_sagas(store, [SagaState.RUNNING], cursor=cursor, limit=limit)
        return RecordPage(tuple(page.records), page.corrupt, page.cursor)

    def act(record: object, fence: Fence, report: SweepReport) -> None:
        return None

    def bounded(lease: Lease, report: SweepReport) -> None:
        if report.pages > 50:
            raise RuntimeError("the sweep walks the same pass again and again")

    # when / then
    with pytest.raises(SagaValidationError):
        sweep(shop.sagas.engine, owner="beat-1", lease_ms=60_000, page_size=1,
              extra_passes=[Pass("refusing", fetch, act)], on_page=bounded)
    assert Leases(store, shop.clock, owner="beat-2").acquire(SWEEP_LEASE, 60_000) is not None


@pytest.mark.parametrize("nested", [3_000, 100_000])
def test_a_deeply_nested_findings_cursor_is_malformed_not_a_crash(
    store: MemoryStore, nested: int
) -> None:
    cursor = base64.urlsafe_b64encode(b"[" * nested).decode()
    with pytest.raises(SagaValidationError):
        page_findings(store, cursor=cursor)
