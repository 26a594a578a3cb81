"""Lease semantics over the store primitives: grant, renew, checkpoint, release."""

from __future__ import annotations

from typing import Any

import pytest

from celery_sagas._leases import Leases
from celery_sagas.errors import FencedWriteRefused, LeaseLost, SagaValidationError
from celery_sagas.stores.base import Envelope, Fence
from celery_sagas.stores.memory import MemoryStore
from celery_sagas.testing import FrozenClock

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
