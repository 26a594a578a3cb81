"""The approval ledger: the storage side of human approvals (docs/design.md §2.4, §3.8).

An approval moves ``pending -> approved | denied | expired`` and ``approved -> consumed |
expired`` (an approval whose token was not used in time expires too).
Every move goes through the package's one compare-and-set loop; a writer that loses the race
reads again and judges again, so of any number of concurrent deciders exactly one decides, and
of any number of concurrent consumers exactly one consumes while the others see
``ApprovalTokenReplay``.

Only the SHA-256 of a resume token is stored and it is compared in constant time. ``consume``
checks the token hash before the binding, so only a token holder learns why a call was refused.
An approval is expired from ``expires_at_ms`` on (``now >= expires_at_ms``). Inputs are
validated before the first read; a refused call writes nothing.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from .. import _values as values
from .._cas import until_written
from .._clock import Clock, now_ms
from .._codec import Codec
from .._frozen import replace
from .._records import APPROVAL, ApprovalRecord, ApprovalState, Binding
from ..errors import (
    ApprovalBindingError,
    ApprovalDecisionError,
    ApprovalDenied,
    ApprovalPending,
    ApprovalTokenExpired,
    ApprovalTokenInvalid,
    ApprovalTokenReplay,
    SagaConflictError,
    SagaValidationError,
)
from ..stores.base import Fence, Store

__all__ = ["ApprovalLedger", "check_binding"]

_DECISIONS = {"approved": ApprovalState.APPROVED, "denied": ApprovalState.DENIED}
_EXPIRABLE = (ApprovalState.PENDING, ApprovalState.APPROVED)

Judge = Callable[[ApprovalRecord | None], ApprovalRecord | None]


def _maybe(check: Callable[[object], str], value: object) -> str | None:
    return None if value is None else check(value)


def check_binding(binding: Binding) -> Binding:
    """Validate every field of a binding (docs/design.md §2.4)."""
    return Binding(
        values.capability(binding.capability),
        values.tenant_id(binding.tenant_id),
        values.principal_id(binding.principal_id),
        _maybe(values.target, binding.target),
        _maybe(values.digest, binding.digest),
    )


def _moved(record: ApprovalRecord, state: ApprovalState, now: int,
           decided_by: str | None = None) -> ApprovalRecord:
    return replace(
        record, state=state, version=record.version + 1,
        updated_at_ms=max(now, record.updated_at_ms), decided_by=decided_by or record.decided_by,
    )


class ApprovalLedger:
    """Approval records over a store: create, decide, consume, expire."""

    def __init__(self, store: Store, clock: Clock, codec: Codec | None = None) -> None:
        self.store = store
        self.clock = clock
        self.codec = codec or Codec()

    def get(self, approval_id: str) -> ApprovalRecord | None:
        """The approval record or None; a corrupt record raises InvalidRecordError."""
        envelope = self.store.get(APPROVAL, values.approval_id(approval_id))
        return None if envelope is None else self.codec.approval(envelope, approval_id)

    def _update(self, approval_id: str, judge: Judge, fence: Fence | None = None
                ) -> ApprovalRecord | None:
        """Read, judge, compare-and-set (fenced for a sweep); on a lost race read and judge again."""

        def write(_: ApprovalRecord | None, moved: ApprovalRecord | None) -> bool:
            assert moved is not None  # None is never written
            envelope = self.codec.approval_envelope(moved, stamp=True)
            return self.store.compare_and_set(envelope, moved.version - 1, fence=fence)

        _, moved = until_written(lambda: self.get(approval_id), judge, write,
                                 what=f"approval {approval_id!r}")
        return moved

    def create(self, *, approval_id: str, effect_id: str, binding: Binding, token_hash: str,
               ttl_ms: int, saga_id: str | None = None, step: str | None = None,
               nonce: str | None = None, now: int | None = None) -> ApprovalRecord:
        """Store a ``pending`` approval expiring ``ttl_ms`` from now; the same call again
        returns it.

        ``nonce`` is the token's nonce: with the coordinator's secret (never stored) it lets the
        coordinator show the token again to whoever started the saga.
        """
        ttl = values.duration_ms(ttl_ms, field="ttl_ms")
        checked = check_binding(binding)
        at = now_ms(self.clock) if now is None else now
        record = ApprovalRecord(
            approval_id=values.approval_id(approval_id),
            effect_id=values.effect_id(effect_id),
            capability=checked.capability,
            tenant_id=checked.tenant_id,
            principal_id=checked.principal_id,
            token_hash=values.digest(token_hash),
            state=ApprovalState.PENDING,
            created_at_ms=at,
            expires_at_ms=values.timestamp_ms(at + ttl, field="approval expiry"),
            updated_at_ms=at,
            target=checked.target,
            digest=checked.digest,
            saga_id=_maybe(values.saga_id, saga_id),
            step=_maybe(values.step_name, step),
            nonce=nonce,
        )
        if self.store.create(self.codec.approval_envelope(record)):
            return record
        existing = self.get(approval_id)
        if existing is None or _request(existing) != _request(record):
            raise SagaConflictError(f"approval {approval_id!r} exists for another request")
        return existing

    def decide(self, approval_id: str, *, tenant_id: str, decision: str,
               decided_by: str) -> ApprovalRecord:
        """Approve or deny a pending, unexpired approval of ``tenant_id``, exactly once."""
        values.approval_id(approval_id)
        values.tenant_id(tenant_id)
        if decision not in _DECISIONS:
            raise SagaValidationError(f"decision must be 'approved' or 'denied', got {decision!r}")
        decider = values.principal_id(decided_by, field="decided by")
        now = now_ms(self.clock)

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

        decided = self._update(approval_id, judge)
        assert decided is not None
        return decided

    def consume(self, approval_id: str, *, token_hash: str, binding: Binding) -> ApprovalRecord:
        """Atomically use an approved approval once; every refusal has its own error."""
        values.approval_id(approval_id)
        values.digest(token_hash)
        wanted = check_binding(binding)
        now = now_ms(self.clock)

        def judge(record: ApprovalRecord | None) -> ApprovalRecord:
            _check_holder(record, approval_id, token_hash, wanted)
            assert record is not None
            _refuse_unusable(record, now)
            return _moved(record, ApprovalState.CONSUMED, now)

        consumed = self._update(approval_id, judge)
        assert consumed is not None
        return consumed

    def check_holder(self, approval_id: str, *, token_hash: str, binding: Binding) -> ApprovalRecord:
        """The approval, once the token's hash matches the stored one (``ApprovalTokenInvalid``
        otherwise) and the caller's binding is the approval's (``ApprovalBindingError``); its
        state is not judged, so a refusal tells nothing about it to one who is not its holder."""
        values.approval_id(approval_id)
        values.digest(token_hash)
        wanted = check_binding(binding)
        record = self.get(approval_id)
        _check_holder(record, approval_id, token_hash, wanted)
        assert record is not None
        return record

    def expire(self, approval_id: str, *, fence: Fence | None = None) -> ApprovalRecord | None:
        """Mark one pending or approved (unused) approval past its expiry as expired; else None.

        A sweep passes its lease's ``fence``: once a newer grant exists the write is refused
        (``FencedWriteRefused``), as its saga writes are. Writing the expiry (rather than only
        judging it) makes a consume that judged the approval usable a moment earlier lose its
        compare-and-set: one of them wins, not both.
        """
        values.approval_id(approval_id)
        now = now_ms(self.clock)

        def judge(record: ApprovalRecord | None) -> ApprovalRecord | None:
            if record is None or record.state not in _EXPIRABLE or now < record.expires_at_ms:
                return None
            return _moved(record, ApprovalState.EXPIRED, now)

        return self._update(approval_id, judge, fence)


def _request(record: ApprovalRecord) -> tuple[object, ...]:
    return (record.effect_id, record.binding, record.token_hash, record.saga_id, record.step)


def _check_holder(record: ApprovalRecord | None, approval_id: str, token_hash: str,
                  wanted: Binding) -> None:
    """Raise unless the stored hash matches the token's, then unless the binding is the same."""
    if record is None or not hmac.compare_digest(record.token_hash, token_hash):
        raise ApprovalTokenInvalid("resume token does not match an approval")
    if record.binding != wanted:
        raise ApprovalBindingError(
            f"approval {approval_id!r} was granted for another request", approval_id=approval_id
        )


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
