"""Lease semantics over the store primitives: grant, renew, checkpoint, release, and takeover
from a holder whose process is gone."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import pytest

from celery_sagas._leases import Leases
from celery_sagas._liveness import claimer_id
from celery_sagas.errors import FencedWriteRefused, LeaseLost, SagaValidationError
from celery_sagas.stores.base import Envelope, Fence, Lease, LeaseHolder
from celery_sagas.stores.memory import MemoryStore
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.proxy import StoreProxy
from celery_sagas.testing.racing import race
from tests.processes import unused_pid

T0 = 1_700_000_000_000


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def alice(store: MemoryStore, clock: FrozenClock) -> Leases:
    return Leases(store, clock, owner="alice")


@pytest.fixture
def bob(store: MemoryStore, clock: FrozenClock) -> Leases:
    return Leases(store, clock, owner="bob")


def test_acquire_grants_a_lease_until_now_plus_lease_ms(alice: Leases) -> None:
    lease = alice.acquire("sweep", 1000)
    assert lease is not None
    assert (lease.name, lease.owner, lease.expires_at_ms) == ("sweep", "alice", T0 + 1000)


def test_every_grant_has_a_fresh_unguessable_token(alice: Leases, clock: FrozenClock) -> None:
    first = alice.acquire("sweep", 1000)
    assert first is not None and alice.release(first)
    second = alice.acquire("sweep", 1000)
    assert second is not None
    assert first.token != second.token and len(first.token) >= 32


def test_the_token_stays_out_of_repr(alice: Leases) -> None:
    lease = alice.acquire("sweep", 1000)
    assert lease is not None and lease.token not in repr(lease)


def test_acquire_while_another_owner_holds_it_returns_none(alice: Leases, bob: Leases) -> None:
    assert alice.acquire("sweep", 1000) is not None
    assert bob.acquire("sweep", 1000) is None


def test_renew_extends_from_now(alice: Leases, bob: Leases, clock: FrozenClock) -> None:
    lease = alice.acquire("sweep", 1000)
    assert lease is not None
    clock.advance(800)
    renewed = alice.renew(lease, 1000)
    assert renewed.expires_at_ms == T0 + 1800
    clock.advance(900)
    assert bob.acquire("sweep", 1000) is None


def test_renew_after_expiry_raises_lease_lost(alice: Leases, clock: FrozenClock) -> None:
    lease = alice.acquire("sweep", 1000)
    assert lease is not None
    clock.advance(1000)
    with pytest.raises(LeaseLost):
        alice.renew(lease, 1000)


def test_renew_after_a_takeover_raises_lease_lost(alice: Leases, bob: Leases, clock: FrozenClock) -> None:
    lease = alice.acquire("sweep", 1000)
    assert lease is not None
    clock.advance(1500)
    assert bob.acquire("sweep", 1000) is not None
    with pytest.raises(LeaseLost):
        alice.renew(lease, 1000)


def test_checkpoint_hands_the_cursor_to_the_next_holder(alice: Leases, bob: Leases) -> None:
    lease = alice.acquire("sweep", 1000)
    assert lease is not None
    alice.checkpoint(lease, "page-3")
    assert alice.release(lease) is True
    taken = bob.acquire("sweep", 1000)
    assert taken is not None and taken.cursor == "page-3"


def test_checkpoint_after_losing_the_lease_raises_lease_lost(
    alice: Leases, bob: Leases, clock: FrozenClock
) -> None:
    lease = alice.acquire("sweep", 1000)
    assert lease is not None
    alice.checkpoint(lease, "kept")
    clock.advance(1000)
    with pytest.raises(LeaseLost):
        alice.checkpoint(lease, "late")
    taken = bob.acquire("sweep", 1000)
    assert taken is not None and taken.cursor == "kept"


def test_release_frees_the_lease_once(alice: Leases, bob: Leases) -> None:
    lease = alice.acquire("sweep", 1000)
    assert lease is not None
    assert alice.release(lease) is True
    assert alice.release(lease) is False
    assert bob.acquire("sweep", 1000) is not None


def test_held_releases_at_exit(alice: Leases, bob: Leases) -> None:
    with alice.held("sweep", 1000) as lease:
        assert lease is not None
        assert bob.acquire("sweep", 1000) is None
    assert bob.acquire("sweep", 1000) is not None


def test_held_releases_when_the_block_raises(alice: Leases, bob: Leases) -> None:
    with pytest.raises(RuntimeError), alice.held("sweep", 1000):
        raise RuntimeError("sweep crashed")
    assert bob.acquire("sweep", 1000) is not None


def test_held_yields_none_and_leaves_the_holder_alone(alice: Leases, bob: Leases, clock: FrozenClock) -> None:
    lease = alice.acquire("sweep", 1000)
    assert lease is not None
    with bob.held("sweep", 1000) as taken:
        assert taken is None
    alice.renew(lease, 1000)


def test_held_releases_even_after_a_renewal(alice: Leases, bob: Leases) -> None:
    with alice.held("sweep", 1000) as lease:
        assert lease is not None
        alice.renew(lease, 5000)
    assert bob.acquire("sweep", 1000) is not None


def test_a_write_fenced_by_a_superseded_grant_is_refused(
    alice: Leases, bob: Leases, store: MemoryStore, clock: FrozenClock
) -> None:
    record = Envelope("saga", "s1", 1, "running", T0, "{}")
    assert store.create(record)
    paused = alice.acquire("sweep", 1000)
    assert paused is not None
    clock.advance(2000)
    current = bob.acquire("sweep", 1000)
    assert current is not None and current.fence > paused.fence
    write = Envelope("saga", "s1", 2, "running", T0 + 2000, '{"by":"paused"}')
    with pytest.raises(FencedWriteRefused):
        store.compare_and_set(write, 1, fence=Fence.of(paused))
    assert store.compare_and_set(write, 1, fence=Fence.of(current)) is True


@pytest.mark.parametrize("lease_ms", [0, -1, True, 1.5, "1000", 2**53])
def test_an_invalid_duration_is_refused(alice: Leases, lease_ms: Any) -> None:
    with pytest.raises(SagaValidationError):
        alice.acquire("sweep", lease_ms)


@pytest.mark.parametrize("name", ["", "has space", "{x}", "x" * 129])
def test_an_invalid_name_is_refused(alice: Leases, name: str) -> None:
    with pytest.raises(SagaValidationError):
        alice.acquire(name, 1000)


@pytest.mark.parametrize("owner", ["", "has space", "x" * 256])
def test_an_invalid_owner_is_refused(store: MemoryStore, clock: FrozenClock, owner: str) -> None:
    with pytest.raises(SagaValidationError):
        Leases(store, clock, owner=owner)


@pytest.mark.parametrize("cursor", ["", "a\nb", "caf\u00e9", "x" * 1025, 7])
def test_an_invalid_cursor_is_refused_and_not_saved(alice: Leases, bob: Leases, cursor: Any) -> None:
    lease = alice.acquire("sweep", 1000)
    assert lease is not None
    alice.checkpoint(lease, "kept")
    with pytest.raises(SagaValidationError):
        alice.checkpoint(lease, cursor)
    alice.release(lease)
    taken = bob.acquire("sweep", 1000)
    assert taken is not None and taken.cursor == "kept"


def test_renew_of_something_that_is_not_a_lease_is_refused(alice: Leases) -> None:
    with pytest.raises(SagaValidationError):
        alice.renew("sweep", 1000)  # type: ignore[arg-type]


# ------------------------------------------------------------------ one lease per bucket


@pytest.fixture
def bucketed() -> MemoryStore:
    return MemoryStore(buckets=4)


def id_in(store: MemoryStore, bucket: int) -> str:
    return next(f"s{n}" for n in range(1000) if store.bucket_of(f"s{n}") == bucket)


def test_each_bucket_has_its_own_lease(bucketed: MemoryStore, clock: FrozenClock) -> None:
    # given
    alice, bob = Leases(bucketed, clock, owner="alice"), Leases(bucketed, clock, owner="bob")

    # when
    mine = [alice.acquire("sweep", 1000, bucket=b) for b in (0, 1)]
    theirs = [bob.acquire("sweep", 1000, bucket=b) for b in (0, 1, 2, 3)]

    # then: bob gets only the buckets alice does not hold
    assert [lease.bucket for lease in mine if lease is not None] == [0, 1]
    assert [None if lease is None else lease.bucket for lease in theirs] == [None, None, 2, 3]


def test_a_bucket_lease_keeps_its_own_fence_and_cursor(bucketed: MemoryStore, clock: FrozenClock) -> None:
    # given
    leases = Leases(bucketed, clock, owner="alice")
    first = leases.acquire("sweep", 1000, bucket=2)
    assert first is not None
    leases.checkpoint(first, "2:cursor")
    leases.release(first)

    # when
    again = leases.acquire("sweep", 1000, bucket=2)
    other = leases.acquire("sweep", 1000, bucket=3)

    # then
    assert again is not None and other is not None
    assert again.fence > first.fence and again.cursor == "2:cursor"
    assert other.cursor is None


def test_a_fence_guards_the_writes_of_its_own_bucket_only(bucketed: MemoryStore, clock: FrozenClock) -> None:
    # given: records in buckets 0 and 1; bucket 0's lease was granted again since
    a, b = id_in(bucketed, 0), id_in(bucketed, 1)
    for record_id in (a, b):
        assert bucketed.create(Envelope("saga", record_id, 1, "running", T0, "{}"))
    paused = Leases(bucketed, clock, owner="alice").acquire("sweep", 1000, bucket=0)
    held = Leases(bucketed, clock, owner="alice").acquire("sweep", 1000, bucket=1)
    assert paused is not None and held is not None
    clock.advance(2000)
    assert Leases(bucketed, clock, owner="bob").acquire("sweep", 1000, bucket=0) is not None

    # when / then: the superseded fence is refused in its bucket ...
    with pytest.raises(FencedWriteRefused):
        bucketed.compare_and_set(Envelope("saga", a, 2, "running", T0, "{}"), 1, fence=Fence.of(paused))
    # ... a bucket's fence is no fence for another bucket's record ...
    with pytest.raises(SagaValidationError):
        bucketed.compare_and_set(Envelope("saga", a, 2, "running", T0, "{}"), 1, fence=Fence.of(held))
    # ... and a newer grant elsewhere does not touch bucket 1's writes
    assert bucketed.compare_and_set(Envelope("saga", b, 2, "running", T0, "{}"), 1, fence=Fence.of(held))


@pytest.mark.parametrize("bucket", [-1, 4, True, "0"])
def test_a_bucket_the_store_does_not_have_is_refused(bucketed: MemoryStore, clock: FrozenClock,
                                                     bucket: Any) -> None:
    with pytest.raises(SagaValidationError):
        Leases(bucketed, clock, owner="alice").acquire("sweep", 1000, bucket=bucket)


# ------------------------------------------------------------------ a holder whose process is gone


def _this_host(pid: int) -> str:
    """The claimer id a process of this host with ``pid`` has (as a sweep's owner)."""
    return f"{claimer_id().rpartition(':')[0]}:{pid}"


def _held_by(store: MemoryStore, clock: FrozenClock, owner: str, bucket: int = 0) -> Lease:
    lease = Leases(store, clock, owner=owner).acquire("sweep", 60_000, bucket=bucket)
    assert lease is not None
    return lease


def test_a_lease_whose_holder_is_alive_waits_for_its_expiry(
    store: MemoryStore, clock: FrozenClock, bob: Leases
) -> None:
    # given: the lease held by a live process of this host (our parent) and by this process
    for pid in (os.getppid(), os.getpid()):
        held = _held_by(store, clock, _this_host(pid))

        # when / then: refused until it expires, and the holder keeps it
        clock.advance(59_999)
        assert bob.acquire("sweep", 1000) is None
        assert store.lease_holder("sweep") == LeaseHolder(held.owner, held.fence, held.expires_at_ms)
        clock.advance(1)
        taken = bob.acquire("sweep", 1000)
        assert taken is not None and bob.release(taken)


def test_a_lease_of_another_host_is_never_judged_by_its_pid(
    store: MemoryStore, clock: FrozenClock, bob: Leases
) -> None:
    _held_by(store, clock, f"elsewhere:{unused_pid()}")
    assert bob.acquire("sweep", 1000) is None


def test_a_lease_whose_holder_died_is_taken_over_at_once(
    store: MemoryStore, clock: FrozenClock, bob: Leases, caplog: pytest.LogCaptureFixture
) -> None:
    # given: a sweeper of this host that checkpointed, then was SIGKILLed (its pid is gone)
    record = Envelope("saga", "s1", 1, "running", T0, "{}")
    assert store.create(record)
    dead = Leases(store, clock, owner=_this_host(unused_pid()))
    held = _held_by(store, clock, dead.owner)
    dead.checkpoint(held, "page-7")

    # when
    clock.advance(1)
    with caplog.at_level(logging.INFO, logger="celery_sagas.sweep"):
        taken = bob.acquire("sweep", 1000)

    # then: a newer grant now, from the checkpoint, logged with owner ids (never a token)
    assert taken is not None and taken.owner == "bob"
    assert taken.fence > held.fence and taken.cursor == "page-7"
    [line] = [r.getMessage() for r in caplog.records if "taken over" in r.getMessage()]
    assert dead.owner in line and "owner=bob" in line and f"replaces {held.fence}" in line
    assert held.token not in caplog.text and taken.token not in caplog.text
    # and the old holder, were it somehow alive, is fenced out
    with pytest.raises(LeaseLost):
        dead.renew(held, 60_000)
    with pytest.raises(FencedWriteRefused):
        store.compare_and_set(Envelope("saga", "s1", 2, "running", T0, "{}"), 1, fence=Fence.of(held))
    assert store.compare_and_set(Envelope("saga", "s1", 2, "running", T0, "{}"), 1,
                                 fence=Fence.of(taken))


def test_a_dead_holders_lease_is_taken_over_in_its_own_bucket_only(
    bucketed: MemoryStore, clock: FrozenClock
) -> None:
    dead = _this_host(unused_pid())
    held = [_held_by(bucketed, clock, dead, bucket=b) for b in (0, 1)]
    alive = _held_by(bucketed, clock, _this_host(os.getppid()), bucket=2)
    bob = Leases(bucketed, clock, owner="bob")

    taken = [bob.acquire("sweep", 1000, bucket=b) for b in (0, 1, 2)]

    assert [t is not None and t.fence > held[b].fence for b, t in enumerate(taken[:2])] == [True] * 2
    assert taken[2] is None
    assert bucketed.lease_holder("sweep", bucket=2) == LeaseHolder(alive.owner, alive.fence,
                                                                   alive.expires_at_ms)


class _HolderReadTogether(StoreProxy):
    """Every racer reads the dead holder before any of them takes the lease over."""

    def __init__(self, store: MemoryStore, parties: int) -> None:
        super().__init__(store)
        self._barrier = threading.Barrier(parties, timeout=60)

    def lease_holder(self, name: str, *, bucket: int = 0) -> LeaseHolder | None:
        found = super().lease_holder(name, bucket=bucket)
        self._barrier.wait()
        return found


def test_of_racers_taking_over_a_dead_holders_lease_exactly_one_wins(
    store: MemoryStore, clock: FrozenClock
) -> None:
    # given: a dead holder; 16 sweepers all see it dead before any takes the lease over
    held = _held_by(store, clock, _this_host(unused_pid()))
    racing = _HolderReadTogether(store, 16)

    # when
    results = race(lambda i: Leases(racing, clock, owner=f"racer{i}").acquire("sweep", 1000), 16)

    # then
    winners = [r for r in results if isinstance(r, Lease)]
    assert len(winners) == 1 and results.count(None) == 15, results
    assert winners[0].fence == held.fence + 1
    holder = store.lease_holder("sweep")
    assert holder is not None and holder.owner == winners[0].owner
