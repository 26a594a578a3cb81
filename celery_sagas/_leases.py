"""Lease semantics over the store's four lease primitives (docs/design.md §4.1, §5).

A lease lets one sweeper work at a time. Each grant carries a fresh random token (only the
holder knows it) and a fencing number that strictly increases with every grant of the name.
A holder that pauses past its expiry (GC, SIGSTOP) may wake up and write as if it still held
the lease, so writes made under a lease pass its fence and the store refuses them once a newer
grant exists::

    leases = Leases(store, clock, owner="beat-1")
    with leases.held("sweep", lease_ms=30_000) as lease:
        if lease is None:
            return                                   # someone else is sweeping
        store.compare_and_set(envelope, version, fence=Fence.of(lease))
        leases.checkpoint(lease, cursor)             # LeaseLost: stop at once
        lease = leases.renew(lease, lease_ms=30_000)  # LeaseLost: stop at once

Renewal and checkpoint failures raise ``LeaseLost``: the holder must stop immediately.

A lease held by a process known to be gone (an owner that is a claimer id of this host whose
pid no longer runs: the rule of step claims, ``_liveness.py``) is taken over at once instead
of after its expiry, on a store with the ``LeaseTakeover`` capability (docs/design.md §5). The
takeover names the dead holder's fence, so of two processes taking over at once exactly one
wins, and the new grant's fence refuses the old holder's writes as any newer grant does.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from ._clock import Clock, now_ms
from ._liveness import process_gone
from ._values import duration_ms, principal_id, timestamp_ms
from .errors import LeaseLost, SagaValidationError
from .stores.base import Lease, LeaseTakeover, Store, check_lease_args

__all__ = ["MAX_CURSOR_LENGTH", "Leases", "new_lease_token"]

MAX_CURSOR_LENGTH = 1024

logger = logging.getLogger("celery_sagas.sweep")


def new_lease_token() -> str:
    """A fresh random lease token (256 bits, URL-safe base64)."""
    return secrets.token_urlsafe(32)


def _check_cursor(cursor: object) -> str | None:
    if cursor is None:
        return None
    if (
        not isinstance(cursor, str)
        or not 0 < len(cursor) <= MAX_CURSOR_LENGTH
        or not (cursor.isascii() and cursor.isprintable())
    ):
        raise SagaValidationError(
            f"lease cursor must be printable ASCII of 1..{MAX_CURSOR_LENGTH} characters"
        )
    return cursor


def _check_lease(lease: object) -> Lease:
    if not isinstance(lease, Lease):
        raise SagaValidationError(f"expected a Lease, got {type(lease).__name__}")
    check_lease_args(lease.name, lease.owner, lease.token)
    return lease


class Leases:
    """Acquire, renew, checkpoint and release named leases for one ``owner``."""

    def __init__(self, store: Store, clock: Clock, *, owner: str) -> None:
        self.store = store
        self.clock = clock
        self.owner = principal_id(owner, field="lease owner")

    def acquire(self, name: str, lease_ms: int, *, bucket: int = 0) -> Lease | None:
        """Grant ``name`` of ``bucket`` to this owner for ``lease_ms``, or None while another
        holds it (a holder known to be gone has it taken over at once)."""
        lease_token = new_lease_token()
        check_lease_args(name, self.owner, lease_token)
        duration = duration_ms(lease_ms, field="lease_ms")
        now = now_ms(self.clock)
        timestamp_ms(now + duration, field="lease expiry")
        lease = self.store.acquire_lease(name, self.owner, lease_token, now, duration, bucket=bucket)
        if lease is None:
            return self._take_over_from_the_gone(name, lease_token, now, duration, bucket)
        return lease

    def _take_over_from_the_gone(self, name: str, lease_token: str, now: int, duration: int,
                                 bucket: int) -> Lease | None:
        """The lease taken over from a holder whose process is known to be gone, or None: the
        holder may be alive (another host, a live pid), the store cannot take a lease over, or
        another process took it first (docs/design.md §5)."""
        if not isinstance(self.store, LeaseTakeover):
            return None
        holder = self.store.lease_holder(name, bucket=bucket)
        if holder is None or not process_gone(holder.owner):
            return None
        lease = self.store.take_over_lease(name, self.owner, lease_token, now, duration,
                                           expected_fence=holder.fence, bucket=bucket)
        if lease is not None:
            logger.info("lease %s bucket=%d taken over from %s (its process is gone): fence %d "
                        "replaces %d, owner=%s", name, bucket, holder.owner, lease.fence,
                        holder.fence, self.owner,
                        extra={"bucket": bucket, "fence": lease.fence})
        return lease

    def renew(self, lease: Lease, lease_ms: int) -> Lease:
        """Extend the lease to now + ``lease_ms``; raise LeaseLost if it expired or moved on."""
        _check_lease(lease)
        duration = duration_ms(lease_ms, field="lease_ms")
        now = now_ms(self.clock)
        timestamp_ms(now + duration, field="lease expiry")
        renewed = self.store.renew_lease(lease, now, duration)
        if renewed is None:
            raise LeaseLost(f"lease {lease.name!r} could not be renewed: stop at once")
        return renewed

    def checkpoint(self, lease: Lease, cursor: str | None) -> None:
        """Save the scan position for the next holder; raise LeaseLost if no longer held."""
        _check_lease(lease)
        checked = _check_cursor(cursor)
        if not self.store.checkpoint_lease(lease, checked, now_ms(self.clock)):
            raise LeaseLost(f"lease {lease.name!r} was lost before its checkpoint: stop at once")

    def release(self, lease: Lease) -> bool:
        """Free the lease (its cursor stays); False if it was no longer held by this token."""
        return self.store.release_lease(_check_lease(lease))

    @contextmanager
    def held(self, name: str, lease_ms: int, *, bucket: int = 0) -> Iterator[Lease | None]:
        """Acquire ``name`` of ``bucket`` for the block (None if taken) and release it at exit."""
        lease = self.acquire(name, lease_ms, bucket=bucket)
        try:
            yield lease
        finally:
            if lease is not None:
                self.release(lease)
