"""The reconciliation sweep: one sweeper at a time under a fenced lease;
a corrupt record is reported and never stops the pass; manual-review sagas are reported."""

from __future__ import annotations

import uuid
from typing import Any

from celery import Celery

from celery_sagas import MemoryStore, Sagas
from celery_sagas._codec import Codec
from celery_sagas._leases import Leases
from celery_sagas._liveness import claimer_id
from celery_sagas._protocol.findings import FindingKind
from celery_sagas._records import SagaState
from celery_sagas._scans import Scans
from celery_sagas._sweep import SWEEP_LEASE, Sweeper, SweepReport
from celery_sagas.stores.base import Envelope
from celery_sagas.testing import FrozenClock
from tests.engine.conftest import Shop, kinds
from tests.processes import unused_pid


def sweeper(shop: Shop, owner: str, on_page: Any = None) -> Sweeper:
    """A sweeper of the shop's engine with its own owner (another beat, or a test's hook)."""
    return Sweeper(shop.sagas.engine, Scans(shop.sagas.store, Codec()), owner=owner,
                   lease_ms=30_000, on_page=on_page)


def test_an_idle_sweep_acquires_the_lease_and_completes(shop: Shop) -> None:
    # when
    report = shop.sagas.sweep()

    # then
    assert report.acquired and report.complete
    assert (report.examined, report.acted, report.errors) == (0, 0, 0)


def test_a_sweep_while_another_sweeper_holds_the_lease_does_nothing(shop: Shop) -> None:
    # given: a lost step message that a sweep would re-send, and another sweeper holding the lease
    shop.start_order()
    shop.driver.take()
    shop.clock.advance(shop.sagas.settings.timing.stale_ms + 1)
    held = Leases(shop.sagas.store, shop.clock, owner="beat-on-another-host").acquire(SWEEP_LEASE, 30_000)
    assert held is not None

    # when
    report = shop.sagas.sweep()

    # then
    assert report.acquired is False
    assert report.examined == 0
    assert shop.driver.take() == []


def test_a_second_sagas_on_the_same_store_is_refused_while_the_first_sweeps(
    shop: Shop, store: MemoryStore, clock: FrozenClock
) -> None:
    # given: a second app (another beat) on the same store
    other = Sagas(Celery(f"beat-{uuid.uuid4().hex[:8]}", set_as_current=False), store=store,
                  allow_non_durable=True, clock=clock)
    shop.start_order()
    seen: list[SweepReport] = []

    def second_sweeper_mid_pass(*_: object) -> None:
        if not seen:
            seen.append(other.sweep())

    # when: the second sweeper tries while the first is between pages
    first = sweeper(shop, "beat-1", second_sweeper_mid_pass).sweep()

    # then
    assert first.acquired and first.complete
    assert [r.acquired for r in seen] == [False]


def test_a_direct_sweep_with_another_owner_is_refused_while_the_lease_is_held(shop: Shop) -> None:
    # given
    seen: list[SweepReport] = []

    def intruder(*_: object) -> None:
        if not seen:
            seen.append(sweeper(shop, "intruder").sweep())

    # when
    sweeper(shop, "beat-1", intruder).sweep()

    # then
    assert seen[0].acquired is False


def test_the_lease_is_released_after_a_sweep_so_the_next_one_runs(shop: Shop) -> None:
    # given
    first = shop.sagas.sweep()

    # when
    second = shop.sagas.sweep()

    # then
    assert first.acquired and second.acquired
    assert second.fence is not None and first.fence is not None and second.fence > first.fence


def test_an_expired_lease_of_a_vanished_sweeper_can_be_taken_over(shop: Shop) -> None:
    # given: a sweeper took the lease and died without releasing it
    Leases(shop.sagas.store, shop.clock, owner="dead-beat").acquire(SWEEP_LEASE, 30_000)

    # when
    shop.clock.advance(30_000)
    report = shop.sagas.sweep()

    # then
    assert report.acquired and report.complete


def test_the_lease_of_a_sweeper_killed_on_this_host_is_taken_over_at_once(shop: Shop) -> None:
    # given: a lost step message, and the lease held for another minute by a sweeper of this
    # host that was SIGKILLed mid-sweep (its pid is gone)
    shop.start_order()
    shop.driver.take()
    shop.clock.advance(shop.sagas.settings.timing.stale_ms + 1)
    dead = f"{claimer_id().rpartition(':')[0]}:{unused_pid()}"
    held = Leases(shop.sagas.store, shop.clock, owner=dead).acquire(SWEEP_LEASE, 60_000)
    assert held is not None

    # when: the next sweep, well before the lease expires
    shop.clock.advance(1)
    report = shop.sagas.sweep()

    # then: it took the bucket over under a newer fence and re-sent the lost message
    assert report.acquired and report.complete
    assert report.fence is not None and report.fence > held.fence
    assert [m.kind for m in shop.driver.take()] == ["step"]


def _write_garbage(store: MemoryStore, clock: FrozenClock, record_id: str, body: str) -> None:
    assert store.create(Envelope("saga", record_id, 1, "running", clock.now_ms(), body))


def test_a_corrupt_record_is_reported_in_the_sweep(shop: Shop, store: MemoryStore) -> None:
    # given
    _write_garbage(store, shop.clock, "corrupt-1", "{this is not json")
    shop.clock.advance(shop.sagas.settings.timing.stale_ms + 1)

    # when
    report = shop.sagas.sweep()

    # then
    assert [(c.kind, c.id) for c in report.corrupt] == [("saga", "corrupt-1")]
    assert report.complete


def test_a_corrupt_record_does_not_stop_the_sweep_from_repairing_others(
    shop: Shop, store: MemoryStore
) -> None:
    # given: garbage stored before and after a saga whose step message was lost
    _write_garbage(store, shop.clock, "corrupt-1", "[]")
    shop.start_order()
    lost = shop.driver.take()
    _write_garbage(store, shop.clock, "corrupt-2", '{"saga_id": "someone-else"}')
    shop.clock.advance(shop.sagas.settings.timing.stale_ms + 1)

    # when
    report = shop.sagas.sweep()

    # then
    assert sorted(c.id for c in report.corrupt) == ["corrupt-1", "corrupt-2"]
    assert report.complete and report.errors == 0
    sent = shop.driver.take()
    assert kinds(sent) == [("step", "shop.reserve")]
    assert sent[0].effect_id == lost[0].effect_id


def test_a_corrupt_record_never_raises_out_of_the_sweep(shop: Shop, store: MemoryStore) -> None:
    # given: a body that decodes but breaks the record rules (version mismatch, unknown state)
    _write_garbage(store, shop.clock, "corrupt-1", '{"saga_id": "corrupt-1", "state": "exploded"}')
    shop.clock.advance(shop.sagas.settings.timing.stale_ms + 1)

    # when
    first = shop.sagas.sweep()
    second = shop.sagas.sweep()

    # then: reported every time, never acted on
    assert [c.id for c in first.corrupt] == [c.id for c in second.corrupt] == ["corrupt-1"]


def test_a_saga_in_manual_review_is_reported_by_the_sweep(shop: Shop) -> None:
    # given
    shop.script.then("charge", ConnectionError("reset"))
    shop.start_order()
    shop.driver.run_until_idle()
    effect_id = shop.step("shop.charge").effect_id

    # when
    report = shop.sagas.sweep()

    # then
    [finding] = report.findings
    assert (finding.kind, finding.record_id) == (FindingKind.AMBIGUOUS_EXECUTION, "o-1")
    assert (finding.step, finding.effect_id) == ("shop.charge", effect_id)
    assert shop.record().state == SagaState.MANUAL_REVIEW


def test_a_sweep_asked_for_before_the_last_complete_sweep_skips_every_bucket(shop: Shop) -> None:
    """Two beats and slow sweeps queue sweep messages up faster than they run; one that waited
    in the queue finds the buckets swept since it was sent and skips them, so the backlog drains
    and step and compensation messages behind it are not starved (docs/design.md §5)."""
    # given: a lost step message, re-sent by a sweep asked for after it
    shop.start_order()
    shop.driver.take()
    shop.clock.advance(shop.sagas.settings.timing.stale_ms + 1)
    asked = shop.clock.now_ms()
    first = shop.sagas.sweep(sent_at_ms=asked)
    assert first.complete and first.acted == 1 and len(shop.driver.take()) == 1
    # and the re-sent message is lost again
    shop.clock.advance(shop.sagas.settings.timing.stale_ms + 1)

    # when: a sweep asked for before the first one ran (queued behind it), then a new one
    queued = shop.sagas.sweep(sent_at_ms=asked - 1)
    sent_by_queued = shop.driver.take()
    fresh = shop.sagas.sweep(sent_at_ms=shop.clock.now_ms())

    # then: the queued one skips every bucket; the new one walks them and re-sends the step
    assert queued.complete and (queued.examined, queued.acted, queued.buckets) == (0, 0, 0)
    assert sent_by_queued == []
    assert fresh.complete and fresh.acted == 1 and len(shop.driver.take()) == 1


def test_a_sweep_asked_for_without_a_time_walks_every_bucket(shop: Shop) -> None:
    # given
    shop.start_order()
    shop.driver.take()
    shop.clock.advance(shop.sagas.settings.timing.stale_ms + 1)
    shop.sagas.sweep()
    shop.driver.take()
    shop.clock.advance(shop.sagas.settings.timing.stale_ms + 1)

    # when
    report = shop.sagas.sweep()

    # then
    assert report.complete and report.acted == 1 and len(shop.driver.take()) == 1
