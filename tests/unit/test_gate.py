"""The approval coordinator: open, show the token again, decide, consume, expire.

The ledger (tests/unit/test_ledger.py, ``gate.ledger``) and the token format (tests/unit/test_tokens.py) are
tested on their own; these tests cover what ``ApprovalGate`` adds: a token minted for every
approval it opens, its hash and nonce (never the token) in the store, the token shown again
with the secrets, key rotation, and the signature and expiry checks before the ledger is read.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from celery_sagas._approvals.gate import DEFAULT_TTL_MS, ApprovalGate, PendingApproval
from celery_sagas._approvals.tokens import TokenSigner, token_hash
from celery_sagas._records import APPROVAL, ApprovalState, Binding
from celery_sagas.errors import (
    ApprovalBindingError,
    ApprovalDenied,
    ApprovalPending,
    ApprovalRequired,
    ApprovalTokenExpired,
    ApprovalTokenInvalid,
    ApprovalTokenReplay,
    SagaConflictError,
    SagaValidationError,
)
from celery_sagas.stores.memory import MemoryStore
from celery_sagas.testing import FrozenClock

T0 = 1_700_000_000_000
TTL = 60_000
OLD = b"o" * 32
NEW = b"n" * 32
DIGEST = "ab" * 32

BINDING: dict[str, Any] = {
    "tenant_id": "t1",
    "principal_id": "alice",
    "capability": "payments.refund",
    "target": "order-42",
    "digest": DIGEST,
}


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def gate(store: MemoryStore, clock: FrozenClock) -> ApprovalGate:
    return ApprovalGate(store, clock, [NEW], ttl_ms=TTL)


def open_one(gate: ApprovalGate, approval_id: str = "a1", **changes: Any) -> ApprovalRequired:
    return gate.open(effect_id="e1", approval_id=approval_id, **{**BINDING, **changes})


def approve(gate: ApprovalGate, approval_id: str = "a1") -> None:
    gate.decide(approval_id, tenant_id="t1", decision="approved", decided_by="bob")


def consume(gate: ApprovalGate, token: object, **changes: Any) -> Any:
    return gate.consume(token, **{**BINDING, **changes})


# ---------------------------------------------------------------- open


def test_open_signals_approval_required_with_ids_expiry_and_token(gate: ApprovalGate) -> None:
    signal = open_one(gate)
    assert (signal.approval_id, signal.effect_id, signal.expires_at_ms) == ("a1", "e1", T0 + TTL)
    assert gate.approval_of(signal.token) == "a1"


def test_open_stores_a_pending_approval_with_the_binding(gate: ApprovalGate) -> None:
    open_one(gate)
    record = gate.get("a1")
    assert record is not None
    assert record.state is ApprovalState.PENDING
    assert (record.tenant_id, record.principal_id, record.capability) == ("t1", "alice",
                                                                          "payments.refund")
    assert (record.target, record.digest, record.expires_at_ms) == ("order-42", DIGEST, T0 + TTL)


def test_open_stores_the_token_hash_and_nonce_never_the_token(
    gate: ApprovalGate, store: MemoryStore
) -> None:
    signal = open_one(gate)
    envelope = store.get(APPROVAL, "a1")
    assert envelope is not None
    assert signal.token not in envelope.body
    assert token_hash(signal.token) in envelope.body
    assert NEW.decode() not in envelope.body


def test_token_expiry_equals_the_record_expiry(gate: ApprovalGate, clock: FrozenClock) -> None:
    signal = open_one(gate)
    clock.set(T0 + TTL - 1)
    assert gate.approval_of(signal.token) == "a1"
    clock.set(T0 + TTL)
    with pytest.raises(ApprovalTokenExpired):
        gate.approval_of(signal.token)


def test_open_without_an_id_makes_a_fresh_one(gate: ApprovalGate) -> None:
    first = gate.open(effect_id="e1", **BINDING)
    second = gate.open(effect_id="e2", **BINDING)
    assert first.approval_id != second.approval_id
    assert first.token != second.token


def test_opening_the_same_approval_again_returns_the_same_token(
    gate: ApprovalGate, clock: FrozenClock
) -> None:
    first = open_one(gate)
    clock.advance(1_000)
    again = open_one(gate)
    assert (again.approval_id, again.expires_at_ms, again.token) == (
        "a1", first.expires_at_ms, first.token)


def test_opening_an_approval_id_for_another_request_is_a_conflict(gate: ApprovalGate) -> None:
    open_one(gate)
    with pytest.raises(SagaConflictError):
        open_one(gate, principal_id="mallory")


@pytest.mark.parametrize(
    "changes",
    [{"capability": "Payments"}, {"tenant_id": ""}, {"target": "a b"}, {"digest": "xyz"},
     {"approval_id": "x" * 129}, {"effect_id": ""}],
)
def test_open_refuses_invalid_input_and_stores_nothing(
    gate: ApprovalGate, store: MemoryStore, changes: dict[str, Any]
) -> None:
    args: dict[str, Any] = {"effect_id": "e1", "approval_id": "a1", **BINDING, **changes}
    with pytest.raises(SagaValidationError):
        gate.open(**args)
    assert store.scan(APPROVAL, [str(s) for s in ApprovalState], limit=10).items == ()


# ---------------------------------------------------------------- configuration


def test_a_short_secret_is_refused(store: MemoryStore, clock: FrozenClock) -> None:
    with pytest.raises(SagaValidationError, match="at least 32"):
        ApprovalGate(store, clock, [b"short"])


@pytest.mark.parametrize("ttl", [0, -1, 1.5, True])
def test_an_invalid_ttl_is_refused(store: MemoryStore, clock: FrozenClock, ttl: Any) -> None:
    with pytest.raises(SagaValidationError):
        ApprovalGate(store, clock, [NEW], ttl_ms=ttl)


def test_the_default_ttl_is_fifteen_minutes(store: MemoryStore, clock: FrozenClock) -> None:
    assert ApprovalGate(store, clock, [NEW]).ttl_ms == DEFAULT_TTL_MS == 15 * 60_000


def test_gate_repr_shows_no_secret(gate: ApprovalGate) -> None:
    assert NEW.decode() not in repr(gate)
    assert repr(gate) == f"ApprovalGate(ttl_ms={TTL})"


# ---------------------------------------------------------------- showing the token again


def test_pending_shows_the_token_again(gate: ApprovalGate) -> None:
    signal = open_one(gate, saga_id="s1", step="manager")
    record = gate.get("a1")
    assert record is not None
    view = gate.pending(record)
    assert view == PendingApproval(
        "a1", "e1", "pending", "payments.refund", "t1", "alice", T0 + TTL, signal.token,
        "order-42", "s1", "manager",
    )


def test_pending_view_and_signal_hide_the_token(gate: ApprovalGate) -> None:
    signal = open_one(gate)
    record = gate.get("a1")
    assert record is not None
    view = gate.pending(record)
    assert view is not None
    for shown in (repr(signal), str(signal), repr(view), str(view), repr(record)):
        assert signal.token not in shown
        assert "token" not in shown.replace("token_hash", "")


def test_a_record_without_a_nonce_has_no_token_to_show(
    gate: ApprovalGate, store: MemoryStore
) -> None:
    gate.ledger.create(approval_id="a9", effect_id="e9", binding=Binding(**BINDING),
                       token_hash=hashlib.sha256(b"x").hexdigest(), ttl_ms=TTL)
    record = gate.get("a9")
    assert record is not None
    assert gate.token_of(record) is None
    assert gate.pending(record) is None


def test_a_record_of_another_secret_has_no_token_to_show(
    store: MemoryStore, clock: FrozenClock
) -> None:
    open_one(ApprovalGate(store, clock, [OLD], ttl_ms=TTL))
    other = ApprovalGate(store, clock, [NEW], ttl_ms=TTL)
    record = other.get("a1")
    assert record is not None
    assert other.token_of(record) is None


# ---------------------------------------------------------------- rotation


def test_after_rotation_an_old_approval_keeps_its_token(store: MemoryStore, clock: FrozenClock) -> None:
    signal = open_one(ApprovalGate(store, clock, [OLD], ttl_ms=TTL))
    rotated = ApprovalGate(store, clock, [NEW, OLD], ttl_ms=TTL)
    record = rotated.get("a1")
    assert record is not None
    assert rotated.token_of(record) == signal.token
    approve(rotated)
    assert consume(rotated, signal.token).state is ApprovalState.CONSUMED


def test_after_rotation_new_approvals_are_signed_with_the_newest_secret(
    store: MemoryStore, clock: FrozenClock
) -> None:
    signal = open_one(ApprovalGate(store, clock, [NEW, OLD], ttl_ms=TTL))
    assert TokenSigner([NEW]).verify(signal.token, now_ms=T0).approval_id == "a1"
    with pytest.raises(ApprovalTokenInvalid):
        TokenSigner([OLD]).verify(signal.token, now_ms=T0)


def test_a_retired_secret_no_longer_resumes(store: MemoryStore, clock: FrozenClock) -> None:
    signal = open_one(ApprovalGate(store, clock, [OLD], ttl_ms=TTL))
    retired = ApprovalGate(store, clock, [NEW], ttl_ms=TTL)
    approve(retired)
    with pytest.raises(ApprovalTokenInvalid):
        consume(retired, signal.token)
    record = retired.get("a1")
    assert record is not None and record.state is ApprovalState.APPROVED


# ---------------------------------------------------------------- decide and consume


def test_approve_then_consume_once(gate: ApprovalGate) -> None:
    signal = open_one(gate)
    approve(gate)
    used = consume(gate, signal.token)
    assert (used.state, used.decided_by) == (ApprovalState.CONSUMED, "bob")
    with pytest.raises(ApprovalTokenReplay):
        consume(gate, signal.token)


def test_consume_before_the_decision_is_pending(gate: ApprovalGate) -> None:
    signal = open_one(gate)
    with pytest.raises(ApprovalPending):
        consume(gate, signal.token)


def test_consume_after_a_denial_is_denied(gate: ApprovalGate) -> None:
    signal = open_one(gate)
    gate.decide("a1", tenant_id="t1", decision="denied", decided_by="bob")
    with pytest.raises(ApprovalDenied):
        consume(gate, signal.token)


def test_a_binding_mismatch_leaves_the_approval_usable(gate: ApprovalGate) -> None:
    signal = open_one(gate)
    approve(gate)
    with pytest.raises(ApprovalBindingError):
        consume(gate, signal.token, target="order-43")
    assert consume(gate, signal.token).state is ApprovalState.CONSUMED


def test_an_authentic_token_of_an_unknown_approval_is_invalid(
    store: MemoryStore, clock: FrozenClock
) -> None:
    elsewhere = open_one(ApprovalGate(MemoryStore(), clock, [NEW], ttl_ms=TTL))
    gate = ApprovalGate(store, clock, [NEW], ttl_ms=TTL)
    with pytest.raises(ApprovalTokenInvalid):
        consume(gate, elsewhere.token)


def test_an_authentic_token_of_a_reopened_approval_id_is_invalid(
    clock: FrozenClock,
) -> None:
    # Same secret, same approval id, another store: only the stored hash ties a token to it.
    first = open_one(ApprovalGate(MemoryStore(), clock, [NEW], ttl_ms=TTL))
    gate = ApprovalGate(MemoryStore(), clock, [NEW], ttl_ms=TTL)
    open_one(gate)
    approve(gate)
    with pytest.raises(ApprovalTokenInvalid):
        consume(gate, first.token)


def test_an_expired_token_is_refused_before_the_store_is_read(
    gate: ApprovalGate, clock: FrozenClock
) -> None:
    signal = open_one(gate)
    approve(gate)
    clock.set(T0 + TTL)
    with pytest.raises(ApprovalTokenExpired):
        consume(gate, signal.token)
    record = gate.get("a1")
    assert record is not None and record.state is ApprovalState.APPROVED


@pytest.mark.parametrize("token", [None, 42, b"v1.x.y", "", "v1.", "not a token"])
def test_garbage_tokens_are_invalid(gate: ApprovalGate, token: object) -> None:
    open_one(gate)
    approve(gate)
    with pytest.raises(ApprovalTokenInvalid):
        consume(gate, token)
    with pytest.raises(ApprovalTokenInvalid):
        gate.approval_of(token)
