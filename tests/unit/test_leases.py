"""Lease semantics over the store primitives (SPEC §5): grant, renew, checkpoint, release."""

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
