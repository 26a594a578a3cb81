"""The sweep: each finding reported once and only for an operator, every corrupt
record reported, the lease freed whatever fails after it was granted, no endless walk."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from celery_sagas import MemoryStore
from celery_sagas._codec import Codec
from celery_sagas._engine import Engine
from celery_sagas._findings import Findings
from celery_sagas._leases import Leases
from celery_sagas._records import SagaRecord, SagaState
from celery_sagas._scans import RecordPage, Scans
from celery_sagas._sweep import SWEEP_LEASE, Pass, Sweeper, SweepReport
from celery_sagas.errors import SagaValidationError, StoreError
from celery_sagas.stores.base import Envelope, Fence, Lease
from tests.engine.conftest import Shop


def test_a_compensation_just_dispatched_is_not_reported_as_a_finding(shop: Shop) -> None:
    # given: ship declined, charge's refund sent a moment ago (in flight, not stale)
    shop.refund_pending()
    assert shop.record().state == SagaState.COMPENSATING

    # when
    report = shop.sagas.sweep()

    # then: nothing needs an operator, as the findings pages say too
    assert report.findings == []
    assert shop.sagas.findings().findings == ()


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


def test_a_corrupt_record_in_the_due_index_is_reported_and_the_sweep_goes_on(
    shop: Shop, store: MemoryStore
) -> None:
    # given: a saga record whose body is garbage, due for a retry
    now = shop.clock.now_ms()
    assert store.create(Envelope("saga", "s-1", 1, "running", now - 1, "{garbage", due_at_ms=now - 1))

    # when
    first = shop.sagas.sweep()
    second = shop.sagas.sweep()

    # then: reported every time, never acted on, nothing else disturbed
    for report in (first, second):
        assert ("saga", "s-1") in {(c.kind, c.id) for c in report.corrupt}
        assert report.complete and report.errors == 0


def _sweeper(shop: Shop, **options: Any) -> Sweeper:
    return Sweeper(shop.sagas.engine, Scans(shop.sagas.store, Codec()), owner="beat-1",
                   lease_ms=60_000, **options)


def test_a_failure_to_count_sagas_leaves_no_lease_held(
    shop: Shop, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: the store fails the gauge's counts
    def count(*_: Any, **__: Any) -> int:
        raise StoreError("store went away")

    monkeypatch.setattr(store, "count", count)

    # when
    with pytest.raises(StoreError):
        _sweeper(shop, count_states=True).sweep()

    # then: the next sweeper need not wait for the lease to expire
    assert Leases(store, shop.clock, owner="beat-2").acquire(SWEEP_LEASE, 60_000) is not None


def test_a_cursor_the_store_refuses_mid_walk_stops_the_sweep_instead_of_looping(
    shop: Shop, store: MemoryStore
) -> None:
    # given: two running sagas, and a pass whose store refuses its own next-page cursor
    for saga_id in ("o-1", "o-2"):
        shop.start_order(saga_id)
    shop.driver.take()
    scans = Scans(store, Codec())

    def fetch(bucket: int, cursor: str | None, limit: int) -> RecordPage[SagaRecord]:
        if cursor is not None:
            raise SagaValidationError("malformed scan cursor")
        return scans.sagas([SagaState.RUNNING], bucket=bucket, cursor=cursor, limit=limit)

    def act(record: SagaRecord, fence: Fence, report: SweepReport) -> None:
        return None

    def refusing(engine: Engine, scans: Scans, now: int) -> Pass[SagaRecord]:
        return Pass("refusing", fetch, act)

    def bounded(lease: Lease, report: SweepReport) -> None:
        if report.pages > 50:
            raise RuntimeError("the sweep walks the same pass again and again")

    # when / then
    with pytest.raises(SagaValidationError):
        _sweeper(shop, page_size=1, extra_passes=[refusing], on_page=bounded).sweep()
    assert Leases(store, shop.clock, owner="beat-2").acquire(SWEEP_LEASE, 60_000) is not None


@pytest.mark.parametrize("nested", [3_000, 100_000])
def test_a_deeply_nested_findings_cursor_is_malformed_not_a_crash(
    store: MemoryStore, nested: int
) -> None:
    cursor = base64.urlsafe_b64encode(b"[" * nested).decode()
    with pytest.raises(SagaValidationError):
        Findings(Scans(store, Codec())).page(cursor=cursor)
