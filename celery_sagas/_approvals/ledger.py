"""The approval ledger: the storage side of human approvals (SPEC §2.3, §4).

An approval moves ``pending -> approved | denied | expired`` and ``approved -> consumed |
expired`` (an approval whose token was not used in time expires too).
Every move is a compare-and-set; a writer that loses the race reloads and judges again, so of
any number of concurrent deciders exactly one decides, and of any number of concurrent
consumers exactly one consumes while the others see ``ApprovalTokenReplay``.

Only the SHA-256 of a resume token is stored and it is compared in constant time. ``consume``
checks the token hash before the binding, so only a token holder learns why a call was refused.
An approval is expired from ``expires_at_ms`` on (``now >= expires_at_ms``). Inputs are
validated before the first read; a refused call writes nothing.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from .. import _values as values
from .._clock import Clock, now_ms
from .._journal import unique_write
from .._records import (
    APPROVAL,
    ApprovalRecord,
    ApprovalState,
    approval_from_envelope,
    approval_to_envelope,
)
from .._scans import scan_approvals
from ..errors import (
    ApprovalBindingError,
    ApprovalDecisionError,
    ApprovalDenied,
    ApprovalPending,
    ApprovalTokenExpired,
    ApprovalTokenInvalid,
    ApprovalTokenReplay,
    SagaConcurrencyError,
    SagaConflictError,
    SagaValidationError,
)
from ..stores.base import MAX_SCAN_LIMIT, Fence, Store

__all__ = ["consume", "create_approval", "decide", "expire", "expire_due", "get_approval"]

# A CAS is lost only when another writer succeeded, so this bounds a pathological livelock only.
MAX_ATTEMPTS = 64

_DECISIONS = {"approved": ApprovalState.APPROVED, "denied": ApprovalState.DENIED}

T = TypeVar("T", bound="ApprovalRecord | None")


def _maybe(check: Callable[[object], str], value: object) -> str | None:
    return None if value is None else check(value)


def _moved(
    record: ApprovalRecord, state: ApprovalState, now: int, decided_by: str | None = None
) -> ApprovalRecord:
    return replace(
        record,
        state=state,
        version=record.version + 1,
        updated_at_ms=max(now, record.updated_at_ms),
        decided_by=decided_by or record.decided_by,
    )


def _settle(
    store: Store,
    approval_id: str,
    judge: Callable[[ApprovalRecord | None], T],
    fence: Fence | None = None,
) -> T:
    """Load, judge, compare-and-set (fenced for a sweep); on a lost race reload and judge again."""
    for _ in range(MAX_ATTEMPTS):
        moved = judge(get_approval(store, approval_id))
        if moved is None:
            return moved
        envelope = unique_write(approval_to_envelope(moved))
        if store.compare_and_set(envelope, moved.version - 1, fence=fence):
            return moved
    raise SagaConcurrencyError(f"approval {approval_id!r} kept changing; gave up")


def get_approval(store: Store, approval_id: str) -> ApprovalRecord | None:
    """The approval record or None; a corrupt record raises InvalidRecordError."""
    envelope = store.get(APPROVAL, values.approval_id(approval_id))
    return None if envelope is None else approval_from_envelope(envelope, approval_id)


def create_approval(
    store: Store,
    clock: Clock,
    *,
    approval_id: str,
    effect_id: str,
    capability: str,
    tenant_id: str,
    principal_id: str,
    token_hash: str,
    ttl_ms: int,
    target: str | None = None,
    digest: str | None = None,
    saga_id: str | None = None,
    step: str | None = None,
    nonce: str | None = None,
) -> ApprovalRecord:
    """Store a ``pending`` approval expiring ``ttl_ms`` from now; the same call again returns it.

    ``nonce`` is the token's nonce: with the coordinator's secret (never stored) it lets the
    coordinator show the token again to whoever started the saga.
    """
    ttl = values.duration_ms(ttl_ms, field="ttl_ms")
    now = now_ms(clock)
    record = ApprovalRecord(
        approval_id=values.approval_id(approval_id),
        effect_id=values.effect_id(effect_id),
        capability=values.capability(capability),
        tenant_id=values.tenant_id(tenant_id),
        principal_id=values.principal_id(principal_id),
        token_hash=values.digest(token_hash),
        state=ApprovalState.PENDING,
        created_at_ms=now,
        expires_at_ms=values.timestamp_ms(now + ttl, field="approval expiry"),
        updated_at_ms=now,
        target=_maybe(values.target, target),
        digest=_maybe(values.digest, digest),
        saga_id=_maybe(values.saga_id, saga_id),
        step=_maybe(values.step_name, step),
        nonce=nonce,
    )
    if store.create(approval_to_envelope(record)):
        return record
    existing = get_approval(store, approval_id)
    if existing is None or _request(existing) != _request(record):
        raise SagaConflictError(f"approval {approval_id!r} exists for another request")
    return existing


def _request(record: ApprovalRecord) -> tuple[object, ...]:
    return (
        record.effect_id,
        record.capability,
        record.tenant_id,
        record.principal_id,
        record.token_hash,
        record.target,
        record.digest,
        record.saga_id,
        record.step,
    )


def decide(
    store: Store,
    clock: Clock,
    approval_id: str,
    *,
    tenant_id: str,
    decision: str,
    decided_by: str,
) -> ApprovalRecord:
    """Approve or deny a pending, unexpired approval of ``tenant_id``, exactly once."""
    values.approval_id(approval_id)
    values.tenant_id(tenant_id)
    if decision not in _DECISIONS:
        raise SagaValidationError(f"decision must be 'approved' or 'denied', got {decision!r}")
    decider = values.principal_id(decided_by, field="decided by")
    now = now_ms(clock)

    def judge(record: ApprovalRecord | None) -> ApprovalRecord:
        if record is None or record.tenant_id != tenant_id:
            raise ApprovalDecisionError(
                f"approval {approval_id!r} cannot be decided", approval_id=approval_id
            )
        if record.state is not ApprovalState.PENDING:
            raise ApprovalDecisionError(
                f"approval {approval_id!r} is already {record.state}", approval_id=approval_id
            )
        if now >= record.expires_at_ms:
            raise ApprovalTokenExpired(f"approval {approval_id!r} expired", approval_id=approval_id)
        return _moved(record, _DECISIONS[decision], now, decided_by=decider)

    return _settle(store, approval_id, judge)


def consume(
    store: Store,
    clock: Clock,
    approval_id: str,
    *,
    token_hash: str,
    tenant_id: str,
    principal_id: str,
    capability: str,
    target: str | None = None,
    digest: str | None = None,
) -> ApprovalRecord:
    """Atomically use an approved approval once; every refusal has its own error."""
    values.approval_id(approval_id)
    values.digest(token_hash)
    binding = (
        values.tenant_id(tenant_id),
        values.principal_id(principal_id),
        values.capability(capability),
        _maybe(values.target, target),
        _maybe(values.digest, digest),
    )
    now = now_ms(clock)

    def judge(record: ApprovalRecord | None) -> ApprovalRecord:
        if record is None or not hmac.compare_digest(record.token_hash, token_hash):
            raise ApprovalTokenInvalid("resume token does not match an approval")
        if _binding(record) != binding:
            raise ApprovalBindingError(
                f"approval {approval_id!r} was granted for another request", approval_id=approval_id
            )
        _refuse_unusable(record, now)
        return _moved(record, ApprovalState.CONSUMED, now)

    return _settle(store, approval_id, judge)


def _binding(record: ApprovalRecord) -> tuple[str | None, ...]:
    return (record.tenant_id, record.principal_id, record.capability, record.target, record.digest)


def _refuse_unusable(record: ApprovalRecord, now: int) -> None:
    """Raise the error that says why a bound, token-matched approval cannot be consumed."""
    name = record.approval_id
    if record.state is ApprovalState.CONSUMED:
        raise ApprovalTokenReplay(f"approval {name!r} was already used", approval_id=name)
    if record.state is ApprovalState.DENIED:
        raise ApprovalDenied(f"approval {name!r} was denied", approval_id=name)
    if record.state is ApprovalState.EXPIRED or now >= record.expires_at_ms:
        raise ApprovalTokenExpired(f"approval {name!r} expired", approval_id=name)
    if record.state is ApprovalState.PENDING:
        raise ApprovalPending(f"approval {name!r} is still pending", approval_id=name)


def expire_due(store: Store, clock: Clock, *, limit: int = 100) -> list[ApprovalRecord]:
    """Mark up to ``limit`` pending approvals past their expiry as ``expired``; return them."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SCAN_LIMIT:
        raise SagaValidationError(f"limit must be an int in 1..{MAX_SCAN_LIMIT}, got {limit!r}")
    now = now_ms(clock)
    expired: list[ApprovalRecord] = []
    cursor: str | None = None
    while len(expired) < limit:
        # A pending approval is never updated, and a positive TTL puts expiry after creation.
        page = scan_approvals(
            store, [ApprovalState.PENDING], updated_before_ms=now, cursor=cursor, limit=limit
        )
        for record in page.records:
            if now >= record.expires_at_ms and len(expired) < limit:
                done = _expire(store, record.approval_id, now)
                if done is not None:
                    expired.append(done)
        if page.cursor is None:
            break
        cursor = page.cursor
    return expired


def expire(
    store: Store, clock: Clock, approval_id: str, *, fence: Fence | None = None
) -> ApprovalRecord | None:
    """Mark one pending or approved (unused) approval past its expiry as expired; else None.

    A sweep passes its lease's ``fence``: once a newer grant exists the write is refused
    (``FencedWriteRefused``), as its saga writes are.
    """
    return _expire(store, values.approval_id(approval_id), now_ms(clock), fence)


_EXPIRABLE = (ApprovalState.PENDING, ApprovalState.APPROVED)


def _expire(
    store: Store, approval_id: str, now: int, fence: Fence | None = None
) -> ApprovalRecord | None:
    # Writing the expiry (rather than only judging it) makes a consume that judged the
    # approval usable a moment earlier lose its compare-and-set: one of them wins, not both.
    def judge(record: ApprovalRecord | None) -> ApprovalRecord | None:
        if record is None or record.state not in _EXPIRABLE:
            return None
        if now < record.expires_at_ms:
            return None
        return _moved(record, ApprovalState.EXPIRED, now)

    return _settle(store, approval_id, judge, fence)
