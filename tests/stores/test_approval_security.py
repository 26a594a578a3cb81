"""Security of human approvals on the memory, Redis and PostgreSQL stores.

Every attack on a resume token gets its own documented error and changes nothing stored:
forged or tampered tokens, truncated, oversized and garbage strings, a token of another
secret, an expired one, a replay, and a genuine token used by another tenant, principal,
capability, target or digest. Sixteen threads consuming one token: one wins, fifteen see a
replay; sixteen deciders: one decides. The raw token is never in a ``repr``, an error, a log
record, a lifecycle event, a metric or the store (its SHA-256 is); a hypothesis fuzz of token
strings only ever raises the documented errors and stores nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from celery_sagas import Sagas
from celery_sagas._approvals.gate import ApprovalGate
from celery_sagas._approvals.tokens import MAX_TOKEN_BYTES, token_hash
from celery_sagas._events import LifecycleEvent
from celery_sagas._records import ApprovalState, SagaState
from celery_sagas.errors import (
    ApprovalBindingError,
    ApprovalDecisionError,
    ApprovalDenied,
    ApprovalPending,
    ApprovalTokenExpired,
    ApprovalTokenInvalid,
    ApprovalTokenReplay,
)
from celery_sagas.stores.base import Store
from celery_sagas.stores.memory import MemoryStore
from celery_sagas.testing import FrozenClock, ReadTogether, race
from celery_sagas.testing.driver import SagaDriver

pytestmark = pytest.mark.parametrize("store", ["memory", "redis", "postgres"], indirect=True)

SECRET = b"k" * 32
OTHER_SECRET = b"z" * 32
TTL = 15 * 60_000
THREADS = 16
DIGEST = "ef" * 32
BINDING: dict[str, Any] = {
    "tenant_id": "t1",
    "principal_id": "alice",
    "capability": "payments.refund",
    "target": "order-42",
    "digest": DIGEST,
}
DOCUMENTED = (ApprovalTokenInvalid, ApprovalTokenExpired, ApprovalTokenReplay,
              ApprovalBindingError, ApprovalPending, ApprovalDenied)
FUZZ = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


# ---------------------------------------------------------------- what a store holds


def dump(store: Store) -> list[str]:
    """Everything the store holds, as text (keys, fields, scores, rows), sorted."""
    if isinstance(store, MemoryStore):
        return _dump_memory(store)
    if hasattr(store, "layout"):
        return _dump_redis(store)
    return _dump_sql(store)


def _dump_memory(store: MemoryStore) -> list[str]:
    with store._lock:
        parts = (store._records, store._index, store._leases, store._fences, store._cursors)
        return sorted(repr(item) for part in parts for item in part.items())


def _dump_redis(store: Any) -> list[str]:
    client = store._client
    readers: dict[str, Callable[[Any], Any]] = {
        "hash": client.hgetall,
        "zset": lambda key: client.zrange(key, 0, -1, withscores=True),
        "string": client.get,
        "set": client.smembers,
        "list": lambda key: client.lrange(key, 0, -1),
    }
    found = []
    for key in client.scan_iter(match=store.layout.pattern(), count=1000):
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        found.append(repr((key, readers[kind](key))))
    return sorted(found)


def _dump_sql(store: Any) -> list[str]:
    tables = (store._tables.envelopes, store._tables.leases)
    with store.engine.connect() as conn:
        return sorted(repr(tuple(row)) for table in tables for row in conn.execute(select(table)))


def assert_hidden(token: str, *texts: str) -> None:
    """Neither the token nor its signature appears in any of ``texts``."""
    signature = token.rpartition(".")[2]
    for text in texts:
        assert token not in text
        assert signature not in text


def shown(exc: BaseException) -> str:
    """Everything an error shows: str, repr, args and the formatted traceback with causes."""
    return "\n".join([str(exc), repr(exc), repr(exc.args), *traceback.format_exception(exc)])


# ---------------------------------------------------------------- the coordinator


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def gate(store: Store, clock: FrozenClock) -> ApprovalGate:
    return ApprovalGate(store, clock, [SECRET], ttl_ms=TTL)


def open_one(gate: ApprovalGate, approval_id: str = "a1", **changes: Any) -> str:
    """Open an approval; return its token."""
    return gate.open(effect_id=f"e-{approval_id}", approval_id=approval_id,
                     **{**BINDING, **changes}).token


def approve(gate: ApprovalGate, approval_id: str = "a1") -> None:
    gate.decide(approval_id, tenant_id="t1", decision="approved", decided_by="bob")


def consume(gate: ApprovalGate, token: object, **changes: Any) -> Any:
    return gate.consume(token, **{**BINDING, **changes})


@pytest.fixture
def approved(gate: ApprovalGate) -> str:
    """The token of approval a1, approved and not yet used."""
    token = open_one(gate)
    approve(gate)
    return token


def refused(error: type[Exception], store: Store, call: Callable[[], object], token: str) -> None:
    """``call`` raises ``error``, shows no token and changes nothing stored."""
    before = dump(store)
    with pytest.raises(error) as caught:
        call()
    assert type(caught.value) is error
    assert_hidden(token, shown(caught.value))
    assert dump(store) == before


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def claims_of(token: str) -> dict[str, Any]:
    segment = token.split(".")[1]
    result: dict[str, Any] = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    return result


def with_claims(token: str, **changes: Any) -> str:
    """The token with changed claims (canonically encoded) and its original signature."""
    claims = {**claims_of(token), **changes}
    body = b64(json.dumps(claims, sort_keys=True, separators=(",", ":")).encode())
    return f"v1.{body}.{token.rpartition('.')[2]}"


def test_the_genuine_token_is_consumed_once(
    gate: ApprovalGate, store: Store, approved: str
) -> None:
    assert consume(gate, approved).state is ApprovalState.CONSUMED
    refused(ApprovalTokenReplay, store, lambda: consume(gate, approved), approved)


def test_a_forged_signature_is_invalid(gate: ApprovalGate, store: Store, approved: str) -> None:
    signed = approved.rpartition(".")[0]
    flipped = approved[:-1] + ("A" if approved[-1] != "A" else "B")
    guessed = f"{signed}.{b64(hmac.new(b'guess' * 8, signed.encode(), hashlib.sha256).digest())}"
    zeros = f"{signed}.{'A' * 43}"
    for forged in (flipped, guessed, zeros):
        refused(ApprovalTokenInvalid, store, lambda t=forged: consume(gate, t), approved)


@pytest.mark.parametrize(
    "changes",
    [{"aid": "a2"}, {"exp": 2**52}, {"n": "A" * 32}, {"v": 2}, {"extra": 1}],
    ids=["approval-id", "expiry", "nonce", "version", "extra-claim"],
)
def test_tampered_claims_are_invalid(
    gate: ApprovalGate, store: Store, approved: str, changes: dict[str, Any]
) -> None:
    open_one(gate, "a2")
    approve(gate, "a2")
    tampered = with_claims(approved, **changes)
    refused(ApprovalTokenInvalid, store, lambda: consume(gate, tampered), approved)


def test_truncated_tokens_are_invalid(gate: ApprovalGate, store: Store, approved: str) -> None:
    for cut in (1, 2, 10, 43, 44, len(approved) // 2, len(approved) - 3):
        for truncated in (approved[:-cut], approved[cut:]):
            refused(ApprovalTokenInvalid, store, lambda t=truncated: consume(gate, t), approved)


def test_oversized_tokens_are_invalid(gate: ApprovalGate, store: Store, approved: str) -> None:
    padded = approved + "A" * (MAX_TOKEN_BYTES + 1 - len(approved))
    for oversized in (padded, approved + "." + "A" * 10_000, "v1." + "A" * 10**6):
        refused(ApprovalTokenInvalid, store, lambda t=oversized: consume(gate, t), approved)


@pytest.mark.parametrize(
    "garbage",
    [None, 0, 3.5, b"bytes", ["v1"], "", " ", "v1", "v1..", "v2.e30.AAAA", "v1.e30." + "A" * 43,
     "\x00" * 64, "v1.\u00e9.x", "v1.%%%.%%%"],
    ids=repr,
)
def test_garbage_tokens_are_invalid(
    gate: ApprovalGate, store: Store, approved: str, garbage: object
) -> None:
    refused(ApprovalTokenInvalid, store, lambda: consume(gate, garbage), approved)


def test_a_token_of_another_secret_is_invalid(
    gate: ApprovalGate, store: Store, clock: FrozenClock, approved: str
) -> None:
    record = gate.get("a1")
    assert record is not None and record.nonce is not None
    elsewhere = ApprovalGate(store, clock, [OTHER_SECRET], ttl_ms=TTL)
    # same claims, even the stored nonce, signed with a secret the coordinator does not hold
    forged = elsewhere.signer.mint(approval_id="a1", nonce=record.nonce,
                                   expires_at_ms=record.expires_at_ms)
    refused(ApprovalTokenInvalid, store, lambda: consume(gate, forged), approved)


def test_an_expired_token_is_expired(
    gate: ApprovalGate, store: Store, clock: FrozenClock, approved: str
) -> None:
    clock.advance(TTL)
    refused(ApprovalTokenExpired, store, lambda: consume(gate, approved), approved)


@pytest.mark.parametrize(
    "changes",
    [{"tenant_id": "t2"}, {"principal_id": "mallory"}, {"capability": "payments.payout"},
     {"target": "order-43"}, {"target": None}, {"digest": "00" * 32}, {"digest": None}],
    ids=str,
)
def test_another_binding_is_refused_and_the_approval_stays_usable(
    gate: ApprovalGate, store: Store, approved: str, changes: dict[str, Any]
) -> None:
    refused(ApprovalBindingError, store, lambda: consume(gate, approved, **changes), approved)
    assert consume(gate, approved).state is ApprovalState.CONSUMED


def test_a_pending_approval_is_pending(gate: ApprovalGate, store: Store) -> None:
    token = open_one(gate)
    refused(ApprovalPending, store, lambda: consume(gate, token), token)


def test_a_denied_approval_is_denied(gate: ApprovalGate, store: Store) -> None:
    token = open_one(gate)
    gate.decide("a1", tenant_id="t1", decision="denied", decided_by="bob")
    refused(ApprovalDenied, store, lambda: consume(gate, token), token)


def test_sixteen_consumers_of_one_token_exactly_one_wins(
    gate: ApprovalGate, store: Store, clock: FrozenClock, approved: str
) -> None:
    racing = ApprovalGate(ReadTogether(store, THREADS), clock, [SECRET], ttl_ms=TTL)
    results = race(lambda _: consume(racing, approved), THREADS)
    won = [r for r in results if not isinstance(r, BaseException)]
    lost = [r for r in results if isinstance(r, BaseException)]
    assert len(won) == 1
    assert len(lost) == THREADS - 1
    assert all(type(r) is ApprovalTokenReplay for r in lost), lost
    record = gate.get("a1")
    assert record is not None
    assert (record.state, record.version) == (ApprovalState.CONSUMED, 3)


def test_sixteen_deciders_exactly_one_decides(
    gate: ApprovalGate, store: Store, clock: FrozenClock
) -> None:
    open_one(gate)
    racing = ApprovalGate(ReadTogether(store, THREADS), clock, [SECRET], ttl_ms=TTL)

    def decide(i: int) -> Any:
        decision = "approved" if i % 2 else "denied"
        return racing.decide("a1", tenant_id="t1", decision=decision, decided_by=f"m{i}")

    results = race(decide, THREADS)
    won = [r for r in results if not isinstance(r, BaseException)]
    assert len(won) == 1
    assert all(type(r) is ApprovalDecisionError for r in results if r not in won)
    record = gate.get("a1")
    assert record == won[0]
    assert record is not None and record.version == 2


def test_another_tenant_cannot_decide(gate: ApprovalGate, store: Store) -> None:
    token = open_one(gate)
    refused(ApprovalDecisionError, store,
            lambda: gate.decide("a1", tenant_id="t2", decision="approved", decided_by="eve"),
            token)


def test_a_decision_after_expiry_is_refused(
    gate: ApprovalGate, store: Store, clock: FrozenClock
) -> None:
    token = open_one(gate)
    clock.advance(TTL)
    refused(ApprovalTokenExpired, store,
            lambda: gate.decide("a1", tenant_id="t1", decision="approved", decided_by="bob"),
            token)
    assert gate.ledger.expire("a1") is not None
    refused(ApprovalDecisionError, store,
            lambda: gate.decide("a1", tenant_id="t1", decision="approved", decided_by="bob"),
            token)


def test_the_store_holds_the_token_hash_never_the_token_or_secret(
    gate: ApprovalGate, store: Store, approved: str
) -> None:
    consume(gate, approved)
    held = "\n".join(dump(store))
    assert_hidden(approved, held)
    assert token_hash(approved) in held
    assert SECRET.decode() not in held


def test_no_coordinator_object_shows_the_token(gate: ApprovalGate, approved: str) -> None:
    record = gate.get("a1")
    assert record is not None
    view = gate.pending(record)
    signal = gate.open(effect_id="e-a1", approval_id="a1", **BINDING)
    assert view is not None and view.token == signal.token == approved
    for obj in (signal, view, record, gate, gate.signer):
        assert_hidden(approved, repr(obj), str(obj))
    assert_hidden(approved, shown(signal))


# ---------------------------------------------------------------- fuzz of the coordinator


@dataclass
class Tokens:
    """Real tokens in every approval state, to mutate; ``usable`` is the one that would work."""

    usable: str
    others: list[str] = field(default_factory=list)

    def all(self) -> list[str]:
        return [self.usable, *self.others]


@pytest.fixture
def tokens(gate: ApprovalGate, store: Store, clock: FrozenClock) -> Tokens:
    """a1 approved (usable), a2 pending, a3 denied, a4 consumed, a5 expired, a6 other secret."""
    short = ApprovalGate(store, clock, [SECRET], ttl_ms=1)
    expired = open_one(short, "a5")
    found = Tokens(open_one(gate, "a1"), [open_one(gate, name) for name in ("a2", "a3", "a4")])
    approve(gate, "a1")
    gate.decide("a3", tenant_id="t1", decision="denied", decided_by="bob")
    approve(gate, "a4")
    consume(gate, found.others[2])
    other = ApprovalGate(MemoryStore(), clock, [OTHER_SECRET], ttl_ms=TTL)
    found.others += [expired, open_one(other, "a1")]
    clock.advance(10)
    return found


@st.composite
def token_strings(draw: st.DrawFn, real: list[str]) -> object:
    """Arbitrary values, token-shaped strings, and real tokens mutated."""
    base = draw(st.sampled_from(real))
    index = draw(st.integers(0, len(base)))
    chars = draw(st.text(max_size=4))
    return draw(st.one_of(
        st.text(max_size=200),
        st.from_regex(r"v1\.[A-Za-z0-9_-]{1,120}\.[A-Za-z0-9_-]{43}", fullmatch=True),
        st.none() | st.integers() | st.binary(max_size=50),
        st.just(base[:index] + chars + base[index + len(chars):]),
        st.just(base[:index] + chars + base[index:]),
        st.just(base[:index]),
        st.just(base + chars),
        st.just(base),
    ))


def test_fuzzed_tokens_raise_only_documented_errors_and_store_nothing(
    gate: ApprovalGate, store: Store, tokens: Tokens
) -> None:
    before = dump(store)

    @FUZZ
    @given(st.data())
    def check(data: st.DataObject) -> None:
        token = data.draw(token_strings(tokens.all()))
        assume(token != tokens.usable)
        with pytest.raises(DOCUMENTED) as caught:
            consume(gate, token)
        assert_hidden(tokens.usable, shown(caught.value))
        assert dump(store) == before

    check()


# ---------------------------------------------------------------- sagas


@dataclass
class Flow:
    """A gated saga on the store under test, driven in-process."""

    sagas: Sagas
    driver: SagaDriver
    clock: FrozenClock
    ran: list[str]
    definition: Any

    def park(self, saga_id: str, order: str = "order-42") -> Any:
        """Start a saga and run it to its gate; return the pending approval."""
        self.definition.start({"order": order}, saga_id=saga_id)
        self.driver.run_until_idle()
        [pending] = self.sagas.approvals.pending(saga_id)
        return pending

    def decide(self, pending: Any, decision: str = "approved") -> None:
        self.sagas.approvals.decide(pending.approval_id, tenant_id="t1", decision=decision,
                                    decided_by="bob")

    def resume(self, saga_id: str, token: object, **changes: str) -> Any:
        who = {"tenant_id": "t1", "principal_id": "alice", **changes}
        return self.sagas.approvals.resume(saga_id, token, **who)


@pytest.fixture
def flow(store: Store, clock: FrozenClock) -> Flow:
    app = Celery("approval-security", set_as_current=False)
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock,
                  approval_secrets=[SECRET], approval_ttl=TTL / 1000)
    driver = SagaDriver(sagas)
    ran: list[str] = []

    @sagas.step(name="sec.hold", compensate="sec.release")
    def hold(order: str) -> dict[str, str]:
        ran.append("hold")
        return {"held": order}

    @sagas.compensator(name="sec.release")
    def release(order: str) -> None:
        ran.append("release")

    @sagas.step(name="sec.refund", compensate=None)
    def refund(order: str) -> dict[str, str]:
        ran.append("refund")
        return {"refunded": order}

    @sagas.saga("sec-refund")
    def run(ctx: Any, data: dict[str, Any]) -> Any:
        ctx.step(hold, data["order"])
        ctx.approval("manager", capability="payments.refund", tenant_id="t1",
                     principal_id="alice", target=data["order"])
        return ctx.step(refund, data["order"])

    return Flow(sagas, driver, clock, ran, run)


def every_path(flow: Flow) -> tuple[list[str], list[BaseException]]:
    """Approve and resume, refuse a stranger and a replay, deny, expire; tokens and errors."""
    tokens: list[str] = []
    errors: list[BaseException] = []

    def attempt(call: Callable[[], object]) -> None:
        try:
            call()
        except Exception as exc:
            errors.append(exc)

    granted = flow.park("s-ok")
    flow.decide(granted)
    attempt(lambda: flow.resume("s-ok", granted.token, principal_id="mallory"))
    flow.resume("s-ok", granted.token)
    attempt(lambda: flow.resume("s-ok", granted.token))
    denied = flow.park("s-no", "order-43")
    flow.decide(denied, "denied")
    attempt(lambda: flow.resume("s-no", denied.token))
    lapsed = flow.park("s-late", "order-44")
    attempt(lambda: flow.resume("s-late", granted.token))
    flow.driver.run_until_idle()
    flow.clock.advance(TTL)
    flow.sagas.sweep()
    flow.driver.run_until_idle()
    attempt(lambda: flow.resume("s-late", lapsed.token))
    tokens += [granted.token, denied.token, lapsed.token]
    states = {s: flow.sagas.get(s).state for s in ("s-ok", "s-no", "s-late")}  # type: ignore[union-attr]
    assert states == {"s-ok": SagaState.COMPLETED, "s-no": SagaState.COMPENSATED,
                      "s-late": SagaState.COMPENSATED}
    assert [type(e) for e in errors] == [ApprovalBindingError, ApprovalTokenReplay,
                                         ApprovalDenied, ApprovalTokenInvalid,
                                         ApprovalTokenExpired]
    return tokens, errors


def test_no_log_record_shows_a_token(flow: Flow, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    tokens, _ = every_path(flow)
    assert any(r.name.startswith("celery_sagas") for r in caplog.records)
    logged = "\n".join(f"{r.getMessage()} {r.__dict__!r}" for r in caplog.records)
    for token in tokens:
        assert_hidden(token, logged, caplog.text)


def test_no_lifecycle_event_shows_a_token(flow: Flow) -> None:
    events: list[LifecycleEvent] = []
    unsubscribe = flow.sagas.subscribe(events.append)
    try:
        tokens, _ = every_path(flow)
    finally:
        unsubscribe()
    assert any(e.step == "manager" for e in events)
    seen = "\n".join(repr(e) for e in events)
    for token in tokens:
        assert_hidden(token, seen)


def test_no_metric_shows_a_token(flow: Flow) -> None:
    metrics = pytest.importorskip("celery_sagas._metrics")
    prometheus = pytest.importorskip("prometheus_client")
    registry = prometheus.CollectorRegistry()
    metrics.SagaMetrics(registry).attach(flow.sagas.events)
    tokens, _ = every_path(flow)
    exposition = prometheus.generate_latest(registry).decode()
    assert "celery_sagas_effects_total" in exposition
    for token in tokens:
        assert_hidden(token, exposition)


def test_no_error_or_object_shows_a_token(flow: Flow) -> None:
    pending = flow.park("s-1")
    tokens, errors = every_path(flow)
    approvals = flow.sagas.approvals
    record = approvals.get(pending.approval_id)
    for token in [*tokens, pending.token]:
        for obj in (pending, record, approvals, approvals.gate, flow.sagas.get("s-1")):
            assert_hidden(token, repr(obj), str(obj))
        for error in errors:
            assert_hidden(token, shown(error))


def test_the_store_never_holds_a_token(flow: Flow, store: Store) -> None:
    tokens, _ = every_path(flow)
    held = "\n".join(dump(store))
    for token in tokens:
        assert_hidden(token, held)
        assert token_hash(token) in held
    assert SECRET.decode() not in held


def test_sixteen_resumes_of_one_token_continue_the_saga_once(flow: Flow, store: Store) -> None:
    # given: a parked, approved saga, and every racer reading the saga before anyone writes
    pending = flow.park("s-1")
    flow.decide(pending)
    engine = flow.sagas.engine
    gate = flow.sagas.approvals.gate
    engine.store = gate.store = ReadTogether(store, THREADS)

    # when
    try:
        results = race(lambda _: flow.resume("s-1", pending.token), THREADS)
    finally:
        engine.store = gate.store = store

    # then
    lost = [r for r in results if isinstance(r, BaseException)]
    assert len(lost) == THREADS - 1
    assert all(type(r) is ApprovalTokenReplay for r in lost), lost
    flow.driver.run_until_idle()
    assert flow.ran == ["hold", "refund"]
    assert flow.sagas.get("s-1").state == SagaState.COMPLETED  # type: ignore[union-attr]


@pytest.fixture
def parked(flow: Flow) -> Iterator[tuple[Any, list[str]]]:
    """s-1 parked and approved; every other token a fuzz may mutate."""
    pending = flow.park("s-1")
    flow.decide(pending)
    others = [flow.park("s-2", "order-43").token, flow.park("s-3", "order-44").token]
    flow.decide(flow.sagas.approvals.pending("s-3")[0])
    yield pending, others


def test_fuzzed_resume_tokens_raise_only_documented_errors_and_store_nothing(
    flow: Flow, store: Store, parked: tuple[Any, list[str]]
) -> None:
    pending, others = parked
    before = dump(store)

    @FUZZ
    @given(st.data())
    def check(data: st.DataObject) -> None:
        token = data.draw(token_strings([pending.token, *others]))
        assume(token != pending.token)
        with pytest.raises(DOCUMENTED) as caught:
            flow.resume("s-1", token)
        assert_hidden(pending.token, shown(caught.value))
        assert dump(store) == before

    check()
    assert flow.ran == ["hold", "hold", "hold"]
    flow.resume("s-1", pending.token)  # the genuine token still works
