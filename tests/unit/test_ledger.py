"""The approval ledger (docs/design.md §2.4, §3.8): create, decide once, consume once, expire.

``ApprovalLedger`` holds the records; expiring every open approval past its expiry is the
sweep's approval pass (tests/engine/test_approvals.py), one ``expire`` per record.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest

from celery_sagas._approvals.ledger import ApprovalLedger
from celery_sagas._leases import Leases
from celery_sagas._records import ApprovalRecord, ApprovalState, Binding
from celery_sagas._values import decode_json
from celery_sagas.errors import (
    ApprovalBindingError,
    ApprovalDecisionError,
    ApprovalDenied,
    ApprovalPending,
    ApprovalTokenExpired,
    ApprovalTokenInvalid,
    ApprovalTokenReplay,
    FencedWriteRefused,
    InvalidRecordError,
    SagaConflictError,
    SagaValidationError,
)
from celery_sagas.stores.base import Envelope, Fence, Store
from celery_sagas.stores.memory import MemoryStore
from celery_sagas.testing import FrozenClock, ReadTogether, race

T0 = 1_700_000_000_000
TTL = 60_000
TOKEN_HASH = hashlib.sha256(b"resume-token").hexdigest()
OTHER_HASH = hashlib.sha256(b"another-token").hexdigest()
DIGEST = "cd" * 32
THREADS = 16
SECRET = b"s" * 32

BINDING: dict[str, Any] = {
    "tenant_id": "t1",
    "principal_id": "alice",
    "capability": "payments.refund",
    "target": "order-42",
    "digest": DIGEST,
}
BINDING_FIELDS = frozenset(BINDING)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


def ledger_of(store: Store, clock: FrozenClock) -> ApprovalLedger:
    return ApprovalLedger(store, clock)


def binding(**changes: Any) -> Binding:
    return Binding(**{**BINDING, **changes})


def create(store: Store, clock: FrozenClock, approval_id: str = "a1", **kw: Any) -> ApprovalRecord:
    bound = {k: v for k, v in kw.items() if k in BINDING_FIELDS}
    args: dict[str, Any] = {
        "approval_id": approval_id,
        "effect_id": "e1",
        "token_hash": TOKEN_HASH,
        "ttl_ms": TTL,
        **{k: v for k, v in kw.items() if k not in BINDING_FIELDS},
    }
    return ledger_of(store, clock).create(binding=binding(**bound), **args)


def decide(store: Store, clock: FrozenClock, approval_id: str, **kw: Any) -> ApprovalRecord:
    return ledger_of(store, clock).decide(approval_id, **kw)


def approve(store: Store, clock: FrozenClock, approval_id: str = "a1") -> ApprovalRecord:
    return decide(store, clock, approval_id, tenant_id="t1", decision="approved", decided_by="bob")


def use(store: Store, clock: FrozenClock, **overrides: Any) -> ApprovalRecord:
    token = overrides.pop("token_hash", TOKEN_HASH)
    return ledger_of(store, clock).consume("a1", token_hash=token, binding=binding(**overrides))


def expire(store: Store, clock: FrozenClock, approval_id: str) -> ApprovalRecord | None:
    return ledger_of(store, clock).expire(approval_id)


def get_approval(store: Store, approval_id: str) -> ApprovalRecord | None:
    return ledger_of(store, FrozenClock(T0)).get(approval_id)


def raw(store: MemoryStore, approval_id: str = "a1") -> Envelope | None:
    return store.get("approval", approval_id)


# ------------------------------------------------------------------ create


def test_create_stores_a_pending_approval_expiring_after_the_ttl(
    store: MemoryStore, clock: FrozenClock
) -> None:
    record = create(store, clock, saga_id="order-42", step="refund")
    assert (record.state, record.version) == (ApprovalState.PENDING, 1)
    assert record.expires_at_ms == T0 + TTL
    assert get_approval(store, "a1") == record


def test_only_the_token_hash_is_stored(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    envelope = raw(store)
    assert envelope is not None
    assert decode_json(envelope.body)["token_hash"] == TOKEN_HASH
    assert "resume-token" not in envelope.body


def test_creating_the_same_approval_again_returns_it(store: MemoryStore, clock: FrozenClock) -> None:
    first = create(store, clock)
    clock.advance(10)
    assert create(store, clock) == first


def test_reusing_an_approval_id_for_another_request_is_a_conflict(
    store: MemoryStore, clock: FrozenClock
) -> None:
    create(store, clock)
    with pytest.raises(SagaConflictError):
        create(store, clock, capability="payments.payout")


@pytest.mark.parametrize(
    "bad",
    [
        {"approval_id": "a b"},
        {"effect_id": "e" * 65},
        {"capability": "Payments"},
        {"tenant_id": ""},
        {"principal_id": "x\ny"},
        {"token_hash": "resume-token"},
        {"ttl_ms": 0},
        {"ttl_ms": -5},
        {"ttl_ms": 2**53},
        {"target": "t" * 129},
        {"digest": "CD" * 32},
        {"saga_id": "s 1"},
        {"step": ""},
    ],
    ids=str,
)
def test_invalid_create_input_writes_nothing(
    store: MemoryStore, clock: FrozenClock, bad: dict[str, Any]
) -> None:
    with pytest.raises(SagaValidationError):
        create(store, clock, **bad)
    assert store.scan("approval", [s.value for s in ApprovalState]).items == ()


# ------------------------------------------------------------------ decide


@pytest.mark.parametrize("decision", ["approved", "denied"])
def test_decide_records_the_decision_and_who_made_it(
    store: MemoryStore, clock: FrozenClock, decision: str
) -> None:
    create(store, clock)
    clock.advance(5)
    decided = decide(store, clock, "a1", tenant_id="t1", decision=decision, decided_by="bob")
    assert (decided.state, decided.decided_by, decided.version) == (decision, "bob", 2)
    assert decided.updated_at_ms == T0 + 5
    assert get_approval(store, "a1") == decided


def test_an_approval_is_decided_only_once(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    approve(store, clock)
    before = raw(store)
    with pytest.raises(ApprovalDecisionError):
        decide(store, clock, "a1", tenant_id="t1", decision="denied", decided_by="carol")
    assert raw(store) == before


def test_another_tenant_cannot_decide(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    before = raw(store)
    with pytest.raises(ApprovalDecisionError):
        decide(store, clock, "a1", tenant_id="t2", decision="approved", decided_by="eve")
    assert raw(store) == before


def test_deciding_a_missing_approval_is_refused(store: MemoryStore, clock: FrozenClock) -> None:
    with pytest.raises(ApprovalDecisionError):
        approve(store, clock, "nope")


def test_an_expired_approval_cannot_be_decided(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    before = raw(store)
    clock.advance(TTL)
    with pytest.raises(ApprovalTokenExpired):
        approve(store, clock)
    assert raw(store) == before


@pytest.mark.parametrize(
    "kwargs",
    [
        {"decision": "maybe"},
        {"decision": "APPROVED"},
        {"tenant_id": "t 1"},
        {"decided_by": ""},
    ],
    ids=str,
)
def test_invalid_decide_input_writes_nothing(
    store: MemoryStore, clock: FrozenClock, kwargs: dict[str, Any]
) -> None:
    create(store, clock)
    before = raw(store)
    args = {"tenant_id": "t1", "decision": "approved", "decided_by": "bob", **kwargs}
    with pytest.raises(SagaValidationError):
        decide(store, clock, "a1", **args)
    assert raw(store) == before


def test_concurrent_deciders_exactly_one_decides(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    racing = ReadTogether(store, THREADS)

    def attempt(_: int) -> ApprovalRecord:
        return decide(racing, clock, "a1", tenant_id="t1", decision="approved", decided_by="bob")

    results = race(attempt, THREADS)
    winners = [r for r in results if isinstance(r, ApprovalRecord)]
    losers = [r for r in results if isinstance(r, ApprovalDecisionError)]
    assert len(winners) == 1 and len(losers) == THREADS - 1, results


# ------------------------------------------------------------------ consume


def test_consume_uses_an_approved_approval(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    approve(store, clock)
    consumed = use(store, clock)
    assert (consumed.state, consumed.version) == (ApprovalState.CONSUMED, 3)
    assert get_approval(store, "a1") == consumed


def test_a_second_consume_is_a_replay(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    approve(store, clock)
    use(store, clock)
    with pytest.raises(ApprovalTokenReplay):
        use(store, clock)


def test_a_replay_is_reported_even_after_expiry(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    approve(store, clock)
    use(store, clock)
    clock.advance(TTL * 2)
    with pytest.raises(ApprovalTokenReplay):
        use(store, clock)


@pytest.mark.parametrize(
    "field, value",
    [
        ("tenant_id", "t2"),
        ("principal_id", "mallory"),
        ("capability", "payments.payout"),
        ("target", "order-43"),
        ("target", None),
        ("digest", "ef" * 32),
        ("digest", None),
    ],
)
def test_a_binding_mismatch_is_refused_and_consumes_nothing(
    store: MemoryStore, clock: FrozenClock, field: str, value: Any
) -> None:
    create(store, clock)
    approve(store, clock)
    before = raw(store)
    with pytest.raises(ApprovalBindingError):
        use(store, clock, **{field: value})
    assert raw(store) == before


def test_a_wrong_token_hash_is_invalid(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    approve(store, clock)
    with pytest.raises(ApprovalTokenInvalid):
        use(store, clock, token_hash=OTHER_HASH)


def test_a_wrong_token_is_judged_before_the_binding(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    approve(store, clock)
    with pytest.raises(ApprovalTokenInvalid):
        use(store, clock, token_hash=OTHER_HASH, tenant_id="t2")


def test_a_token_for_a_missing_approval_is_invalid(store: MemoryStore, clock: FrozenClock) -> None:
    with pytest.raises(ApprovalTokenInvalid):
        use(store, clock)


def test_a_pending_approval_cannot_be_consumed(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    with pytest.raises(ApprovalPending):
        use(store, clock)


def test_a_denied_approval_cannot_be_consumed(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    decide(store, clock, "a1", tenant_id="t1", decision="denied", decided_by="bob")
    with pytest.raises(ApprovalDenied):
        use(store, clock)


def test_an_approved_approval_past_its_expiry_cannot_be_consumed(
    store: MemoryStore, clock: FrozenClock
) -> None:
    create(store, clock)
    approve(store, clock)
    before = raw(store)
    clock.advance(TTL)
    with pytest.raises(ApprovalTokenExpired):
        use(store, clock)
    assert raw(store) == before


def test_an_expired_approval_cannot_be_consumed(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    clock.advance(TTL)
    assert expire(store, clock, "a1") is not None
    with pytest.raises(ApprovalTokenExpired):
        use(store, clock)


@pytest.mark.parametrize(
    "overrides",
    [{"token_hash": "short"}, {"tenant_id": ""}, {"capability": "X"}, {"target": "a b"}],
    ids=str,
)
def test_invalid_consume_input_raises_validation_and_writes_nothing(
    store: MemoryStore, clock: FrozenClock, overrides: dict[str, Any]
) -> None:
    create(store, clock)
    approve(store, clock)
    before = raw(store)
    with pytest.raises(SagaValidationError):
        use(store, clock, **overrides)
    assert raw(store) == before


def test_concurrent_consumers_exactly_one_consumes(store: MemoryStore, clock: FrozenClock) -> None:
    create(store, clock)
    approve(store, clock)
    racing = ReadTogether(store, THREADS)
    results = race(lambda i: use(racing, clock), THREADS)
    consumed = [r for r in results if isinstance(r, ApprovalRecord)]
    replays = [r for r in results if isinstance(r, ApprovalTokenReplay)]
    assert len(consumed) == 1 and len(replays) == THREADS - 1, results


# ------------------------------------------------------------------ expiry sweep


def test_expire_moves_an_unused_approved_approval_past_expiry_to_expired(
    store: MemoryStore, clock: FrozenClock
) -> None:
    create(store, clock)
    approve(store, clock)
    assert expire(store, clock, "a1") is None  # not yet
    clock.advance(TTL)
    expired = expire(store, clock, "a1")
    assert expired is not None and expired.state is ApprovalState.EXPIRED
    with pytest.raises(ApprovalTokenExpired):
        use(store, clock)


@pytest.mark.parametrize("final", ["denied", "consumed"])
def test_expire_leaves_a_settled_approval_alone(
    store: MemoryStore, clock: FrozenClock, final: str
) -> None:
    create(store, clock)
    if final == "denied":
        decide(store, clock, "a1", tenant_id="t1", decision="denied", decided_by="bob")
    else:
        approve(store, clock)
        use(store, clock)
    before = raw(store)
    clock.advance(TTL)
    assert expire(store, clock, "a1") is None
    assert raw(store) == before


def test_a_consume_and_an_expiry_racing_on_one_version_one_wins(store: MemoryStore) -> None:
    # given: the consumer's clock is still before the expiry, the sweeper's is past it
    early, late = FrozenClock(T0), FrozenClock(T0 + TTL)
    create(store, early)
    approve(store, early)
    racing = ReadTogether(store, 2)

    # when
    results = race(
        lambda i: use(racing, early) if i == 0 else expire(racing, late, "a1"), 2
    )

    # then: exactly one of them changed the approval
    consumed, expired = results
    stored = get_approval(store, "a1")
    assert stored is not None
    if isinstance(consumed, ApprovalRecord):
        assert expired is None and stored.state is ApprovalState.CONSUMED
    else:
        assert isinstance(consumed, ApprovalTokenExpired), results
        assert stored.state is ApprovalState.EXPIRED


@pytest.mark.parametrize(
    ("field", "value"),
    [("nonce", "short"), ("nonce", "x" * 65), ("nonce", "bad nonce with spaces!"), ("saga_id", ""),
     ("saga_id", "a b"), ("step", "a\tb"), ("decided_by", ""), ("decided_by", "x" * 300)],
)
def test_an_approval_read_back_with_a_bad_field_is_a_corrupt_record(
    store: MemoryStore, clock: FrozenClock, field: str, value: str
) -> None:
    create(store, clock, "a1", nonce="n" * 22, saga_id="s1", step="refund")
    assert get_approval(store, "a1") is not None
    with store._lock:
        key = ("approval", "a1")
        body = decode_json(store._records[key].body)
        body[field] = value
        store._records[key] = replace(store._records[key], body=json.dumps(body))
    with pytest.raises(InvalidRecordError):
        get_approval(store, "a1")


def test_create_at_a_given_instant_starts_the_ttl_there(store: MemoryStore, clock: FrozenClock) -> None:
    record = create(store, clock, now=T0 - 5_000)
    assert (record.created_at_ms, record.updated_at_ms, record.expires_at_ms) == (
        T0 - 5_000, T0 - 5_000, T0 - 5_000 + TTL)
    assert get_approval(store, "a1") == record


def test_create_records_the_binding_it_was_given(store: MemoryStore, clock: FrozenClock) -> None:
    record = create(store, clock, saga_id="order-42", step="refund", nonce="n" * 22)
    assert record.binding == binding()
    assert (record.saga_id, record.step, record.nonce) == ("order-42", "refund", "n" * 22)


def test_an_expiry_fenced_by_a_superseded_lease_is_refused_and_writes_nothing(
    store: MemoryStore, clock: FrozenClock
) -> None:
    # given: a sweeper's lease expired and another sweeper was granted it since
    create(store, clock)
    old = Leases(store, clock, owner="sweeper-a").acquire("celery_sagas.sweep", 1_000)
    assert old is not None
    clock.advance(TTL)
    new = Leases(store, clock, owner="sweeper-b").acquire("celery_sagas.sweep", 1_000)
    assert new is not None and new.fence > old.fence
    before = raw(store)

    # when / then
    with pytest.raises(FencedWriteRefused):
        ledger_of(store, clock).expire("a1", fence=Fence.of(old))
    assert raw(store) == before
    expired = ledger_of(store, clock).expire("a1", fence=Fence.of(new))
    assert expired is not None and expired.state is ApprovalState.EXPIRED
