"""The approval coordinator (docs/design.md §3.8): open an approval, decide it, consume its token.

    gate = ApprovalGate(store, clock, secrets=[SECRET], ttl_ms=15 * 60_000)
    signal = gate.open(effect_id=..., capability="payments.refund", tenant_id="t1",
                       principal_id="alice", target="order-42")
    # hand signal.token to the requester (never log it); a manager decides:
    gate.decide(signal.approval_id, tenant_id="t1", decision="approved", decided_by="bob")
    # the requester comes back with the token:
    gate.consume(token, tenant_id="t1", principal_id="alice",
                 capability="payments.refund", target="order-42")

The secret never reaches the store; only the SHA-256 of a token does. The token's nonce is
stored beside it so that, with the secret, the coordinator can show a pending approval's token
again to whoever started the work (``token_of``).
"""

from __future__ import annotations

import secrets as random_secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from .. import _values as values
from .._clock import Clock, now_ms
from .._codec import Codec
from .._records import ApprovalRecord, ApprovalState, Binding
from ..errors import ApprovalRequired, SagaConflictError
from ..stores.base import Store
from .ledger import ApprovalLedger
from .tokens import TokenSigner, token_hash

__all__ = ["DEFAULT_TTL_MS", "OPEN_STATES", "ApprovalGate", "PendingApproval"]

DEFAULT_TTL_MS = 15 * 60_000
# The states an approval past its expiry leaves for ``expired``: nobody decided it, or its
# token was never used (docs/design.md §3.8).
OPEN_STATES = (ApprovalState.PENDING, ApprovalState.APPROVED)


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """An approval waiting for a decision or its token, with the token (hidden from repr)."""

    approval_id: str
    effect_id: str
    state: str
    capability: str
    tenant_id: str
    principal_id: str
    expires_at_ms: int
    token: str = field(repr=False)
    target: str | None = None
    saga_id: str | None = None
    step: str | None = None


class ApprovalGate:
    """Creates, decides and consumes approvals over a store; holds the signing secrets."""

    def __init__(self, store: Store, clock: Clock, secrets: Sequence[bytes | str], *,
                 ttl_ms: int = DEFAULT_TTL_MS, codec: Codec | None = None) -> None:
        self.store = store
        self.clock = clock
        self.signer = TokenSigner(secrets)
        self.ttl_ms = values.duration_ms(ttl_ms, field="approval ttl")
        self.ledger = ApprovalLedger(store, clock, codec)

    def __repr__(self) -> str:
        return f"ApprovalGate(ttl_ms={self.ttl_ms})"

    def open(self, *, effect_id: str, capability: str, tenant_id: str, principal_id: str,
             target: str | None = None, digest: str | None = None, saga_id: str | None = None,
             step: str | None = None, approval_id: str | None = None) -> ApprovalRequired:
        """Create a pending approval; returns the approval-required signal carrying the token.

        Opening the same ``approval_id`` again returns the same approval and token.
        """
        name = values.approval_id(approval_id or uuid.uuid4().hex)
        binding = Binding(capability, tenant_id, principal_id, target, digest)
        now = now_ms(self.clock)
        nonce = random_secrets.token_urlsafe(24)
        token = self.signer.mint(approval_id=name, nonce=nonce, expires_at_ms=now + self.ttl_ms)
        try:
            record = self.ledger.create(
                approval_id=name, effect_id=effect_id, binding=binding,
                token_hash=token_hash(token), ttl_ms=self.ttl_ms, saga_id=saga_id, step=step,
                nonce=nonce, now=now,
            )
        except SagaConflictError:
            # The id exists: a fresh nonce made a fresh hash, so judge the request without it.
            record = self._reopened(name, (effect_id, binding, saga_id, step))
        shown = self.token_of(record) or token
        return ApprovalRequired(
            approval_id=record.approval_id, effect_id=record.effect_id,
            expires_at_ms=record.expires_at_ms, token=shown,
        )

    def _reopened(self, approval_id: str, request: tuple[object, ...]) -> ApprovalRecord:
        existing = self.get(approval_id)
        same = existing is not None and (
            existing.effect_id, existing.binding, existing.saga_id, existing.step) == request
        if existing is None or not same or self.token_of(existing) is None:
            raise SagaConflictError(f"approval {approval_id!r} exists for another request")
        return existing

    def token_of(self, record: ApprovalRecord) -> str | None:
        """Re-derive a stored approval's token with the secrets (None if none matches)."""
        if record.nonce is None:
            return None
        for token in self.signer.remint(approval_id=record.approval_id, nonce=record.nonce,
                                        expires_at_ms=record.expires_at_ms):
            if token_hash(token) == record.token_hash:
                return token
        return None

    def get(self, approval_id: str) -> ApprovalRecord | None:
        """The approval record, or None."""
        return self.ledger.get(approval_id)

    def pending(self, record: ApprovalRecord) -> PendingApproval | None:
        """The record with its token, for the party that started the work."""
        token = self.token_of(record)
        if token is None:
            return None
        return PendingApproval(
            record.approval_id, record.effect_id, str(record.state), record.capability,
            record.tenant_id, record.principal_id, record.expires_at_ms, token, record.target,
            record.saga_id, record.step,
        )

    def decide(self, approval_id: str, *, tenant_id: str, decision: str,
               decided_by: str) -> ApprovalRecord:
        """Approve or deny a pending, unexpired approval of this tenant, exactly once."""
        return self.ledger.decide(approval_id, tenant_id=tenant_id, decision=decision,
                                  decided_by=decided_by)

    def consume(self, token: object, *, tenant_id: str, principal_id: str, capability: str,
                target: str | None = None, digest: str | None = None) -> ApprovalRecord:
        """Verify the token (signature, expiry), then consume its approved approval once."""
        claims = self.signer.verify(token, now_ms=now_ms(self.clock))
        assert isinstance(token, str)
        binding = Binding(capability, tenant_id, principal_id, target, digest)
        return self.ledger.consume(claims.approval_id, token_hash=token_hash(token), binding=binding)

    def check_holder(self, token: object, *, tenant_id: str, principal_id: str,
                     capability: str, target: str | None = None,
                     digest: str | None = None) -> ApprovalRecord:
        """Verify the token (signature, expiry), its stored hash and the binding, in that
        order, without judging the approval's state; returns the approval."""
        claims = self.signer.verify(token, now_ms=now_ms(self.clock))
        assert isinstance(token, str)
        binding = Binding(capability, tenant_id, principal_id, target, digest)
        return self.ledger.check_holder(claims.approval_id, token_hash=token_hash(token),
                                        binding=binding)

    def approval_of(self, token: object) -> str:
        """The approval id an authentic, unexpired token names."""
        return self.signer.verify(token, now_ms=now_ms(self.clock)).approval_id
