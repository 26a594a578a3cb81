"""A call that raises has written nothing (docs/errors.md): every public call that writes
(start, signal, cancel, resume, resolve, approve, deny, an approval's resume with its token,
reseal, and the CLI commands over them) is made to raise each error it can raise, on the memory
store, SQLite and Redis, and a dump of the whole store before and after must be equal. The web
actions have their own matrix (tests/web/test_nothing_written.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_sagas import MemoryStore, Sagas
from celery_sagas._leases import Leases
from celery_sagas._records import SagaState
from celery_sagas._sweep import SWEEP_LEASE
from celery_sagas.cli import Session
from celery_sagas.cli import sagas as sagas_cli
from celery_sagas.errors import (
    ApprovalBindingError,
    ApprovalDecisionError,
    ApprovalDenied,
    ApprovalError,
    ApprovalPending,
    ApprovalTokenExpired,
    ApprovalTokenInvalid,
    ApprovalTokenReplay,
    PayloadTooLarge,
    SagaAlreadyFinal,
    SagaConfigurationError,
    SagaConflictError,
    SagaNotFound,
    SagaResolutionError,
    SagaValidationError,
    SignalLimitExceeded,
    UndecryptableRecord,
)
from celery_sagas.stores import open_store
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import ORDER, Script, register_shop
from tests.kept import Kept, close_all, handed_on, memory_dump

SECRET = "s" * 40
KEY = "3ZkPZb0bCaQb5-j0pXM0N2z6XqQxFwCO4JvQn8fXq0U="
GATE = {"tenant_id": "t1", "principal_id": "p1"}  # the gated saga's binding
PAST_EXPIRY_MS = 16 * 60_000  # sagas_approval_ttl is 15 minutes


@dataclass
class World:
    """Sagas in every state a refusal needs, on one store, and a way to dump that store."""

    sagas: Sagas
    app: Celery
    dump: Callable[[], Any]
    clock: FrozenClock
    review_effect: str
    done_effect: str
    approval_id: str
    decided_id: str
    closed_id: str  # pending, its gate closed: the saga was cancelled
    tokens: dict[str, str]  # by saga: "gate" pending, "gate-2" approved, "gate-3" denied, "gate-4" used
    keyed: Sagas  # another process's Sagas on the same store, with an encryption key


def _sql_dump(store: Any) -> Callable[[], Any]:
    def dump() -> Any:
        with store._engine.connect() as connection:
            return {table.name: sorted(tuple(map(repr, row)) for row in
                                       connection.execute(table.select()))
                    for table in store._tables.metadata.sorted_tables}

    return dump


def _redis_dump(store: Any) -> Callable[[], Any]:
    client = store._client
    pattern = store.layout.pattern()
    return lambda: {k: client.dump(k) for k in sorted(client.scan_iter(match=pattern, count=1000))}


@pytest.fixture(scope="module")
def kept() -> Iterator[dict[str, Kept[World]]]:
    """The worlds this pytest process has built, by store kind; closed after the module."""
    worlds: dict[str, Kept[World]] = {}
    yield worlds
    close_all(worlds)


@pytest.fixture(params=["memory", "sqlite", "redis"])
def world(request: pytest.FixtureRequest, kept: dict[str, Kept[World]]) -> Iterator[World]:
    """The world of one store kind. Building it takes most of a test's time, so it is built
    once per pytest process and handed on while tests leave it as built (tests/kept.py)."""
    yield from handed_on(kept, request.param, lambda: _open(request))


def _open(request: pytest.FixtureRequest) -> Kept[World]:
    """A world built on a new store of the kind ``request.param`` names."""
    if request.param == "memory":
        store: Any = MemoryStore()
        dump: Callable[[], Any] = partial(memory_dump, store)
    elif request.param == "sqlite":
        folder = request.getfixturevalue("tmp_path_factory").mktemp("nothing-written")
        store = open_store(f"sqlite:///{folder}/sagas.db")
        dump = _sql_dump(store)
    else:
        url = request.getfixturevalue("redis_url")
        store = open_store(url, key_prefix=f"nw{uuid.uuid4().hex[:8]}",
                           require_aof=False)  # the test Redis runs without AOF
        dump = _redis_dump(store)
    world = _build(store, dump)
    return Kept(world, dump, world.clock, lambda: _close(request.param, store))


def _close(kind: str, store: Any) -> None:
    if kind == "redis":
        from tests.e2e.conftest import wipe_store

        wipe_store(store)
    if kind != "memory":
        store.close()


def _build(store: Any, dump: Callable[[], Any]) -> World:
    clock = FrozenClock()
    app = Celery(f"nw-{uuid.uuid4().hex[:8]}", set_as_current=False)
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock, payload_limit=8192,
                  signal_limit=3, signal_bytes_limit=4000, approval_secrets=[SECRET])
    script = Script()
    _, definitions = _define(sagas, script)
    driver = SagaDriver(sagas)
    definitions["place-order"].start(ORDER, saga_id="done")
    for saga_id in ("wait", "full", "heavy"):
        definitions["waiter"].start({}, saga_id=saga_id)
    definitions["waiter"].start({"pad": "x" * 6000}, saga_id="bulky")
    driver.run_until_idle()
    script.then("charge", ConnectionError("reset after the request left"))
    definitions["place-order"].start({**ORDER, "id": "o-2"}, saga_id="review")
    for saga_id in ("gate", "gate-2", "gate-3", "gate-4", "gate-5"):
        definitions["gated"].start({}, saga_id=saga_id)
    driver.run_until_idle()
    for i in range(3):
        sagas.signal("full", "other", i)
    for _ in range(2):
        sagas.signal("heavy", "other", "x" * 1900)
    pending = {saga_id: p for saga_id in ("gate", "gate-2", "gate-3", "gate-4", "gate-5")
               for p in sagas.approvals.pending(saga_id)}
    for saga_id, decision in (("gate-2", "approved"), ("gate-3", "denied"), ("gate-4", "approved")):
        sagas.approvals.decide(pending[saga_id].approval_id, tenant_id="t1", decision=decision,
                               decided_by="mgr")
    sagas.approvals.resume("gate-4", pending["gate-4"].token, **GATE)
    sagas.cancel("gate-5")
    driver.run_until_idle()
    keyed = _sealed_saga(store, clock)
    review, done = sagas.get("review"), sagas.get("done")
    assert review is not None and review.state is SagaState.MANUAL_REVIEW
    assert done is not None and done.state is SagaState.COMPLETED
    return World(sagas, app, dump, clock, review.steps[1].effect_id, done.steps[1].effect_id,
                 pending["gate"].approval_id, pending["gate-2"].approval_id,
                 pending["gate-5"].approval_id,
                 {saga_id: p.token for saga_id, p in pending.items()}, keyed)


def _define(sagas: Sagas, script: Script) -> tuple[dict[str, Any], dict[str, Any]]:
    tasks, definitions = register_shop(sagas, script)

    @sagas.saga("waiter")
    def waiter(ctx: Any, data: Any) -> Any:
        ctx.step(tasks["reserve"], "sku", 1)
        return ctx.wait_signal("go")

    @sagas.saga("gated")
    def gated(ctx: Any, data: Any) -> Any:
        ctx.step(tasks["reserve"], "sku", 1)
        ctx.approval("ok", capability="orders.approve", tenant_id="t1", principal_id="p1")
        return ctx.step(tasks["charge"], "card", 1)

    definitions["waiter"], definitions["gated"] = waiter, gated
    return tasks, definitions


def _sealed_saga(store: Any, clock: FrozenClock) -> Sagas:
    """A waiting saga sealed with a key the world's Sagas does not list; the Sagas that
    sealed it."""
    sealer = Sagas(Celery(f"seal-{uuid.uuid4().hex[:6]}", set_as_current=False), store=store,
                   allow_non_durable=True, clock=clock, encryption_keys=[KEY])
    driver = SagaDriver(sealer)  # before the start: nothing goes to a real broker
    _define(sealer, Script())[1]["waiter"].start({"secret": 1}, saga_id="sealed")
    driver.run_until_idle()
    return sealer


def _decide(which: str, tenant: str, decision: str, by: str = "mgr",
            **more: Any) -> Callable[[World], Any]:
    """A decision on the world's pending (``which="approval_id"``), decided or closed
    approval; ``which`` may also be an approval id that does not exist."""
    return lambda w: w.sagas.approvals.decide(getattr(w, which, which), tenant_id=tenant,
                                              decision=decision, decided_by=by, **more)


def _later(call: Callable[[World], Any]) -> Callable[[World], Any]:
    """``call`` once the world's approvals are past their expiry (the clock only moves)."""

    def later(w: World) -> Any:
        w.clock.advance(PAST_EXPIRY_MS)
        return call(w)

    return later


def _token(saga_id: str, of: str | None = None, **binding: str) -> Callable[[World], Any]:
    """``approvals.resume`` of ``saga_id`` with the token of ``of`` (default: its own)."""
    return lambda w: w.sagas.approvals.resume(saga_id, w.tokens[of or saga_id],
                                              **{**GATE, **binding})


# (case, call, the error it raises)
CASES: list[tuple[str, Callable[[World], Any], type[Exception]]] = [
    ("start: bad id", lambda w: w.sagas.start("waiter", {}, saga_id=""), SagaValidationError),
    ("start: unknown definition", lambda w: w.sagas.start("nope", {}, saga_id="n-1"),
     SagaConfigurationError),
    ("start: input not JSON", lambda w: w.sagas.start("waiter", {1, 2}, saga_id="n-1"),
     SagaValidationError),
    ("start: input too large", lambda w: w.sagas.start("waiter", "x" * 9000, saga_id="n-1"),
     PayloadTooLarge),
    ("start: id taken", lambda w: w.sagas.start("waiter", {"other": 1}, saga_id="wait"),
     SagaConflictError),
    ("signal: bad name", lambda w: w.sagas.signal("wait", "no spaces!"), SagaValidationError),
    ("signal: no saga", lambda w: w.sagas.signal("missing", "go"), SagaNotFound),
    ("signal: final saga", lambda w: w.sagas.signal("done", "go"), SagaAlreadyFinal),
    ("signal: past the limit", lambda w: w.sagas.signal("full", "other", 4), SignalLimitExceeded),
    ("signal: payload too large", lambda w: w.sagas.signal("wait", "go", "x" * 3000),
     PayloadTooLarge),
    ("signal: undecryptable", lambda w: w.sagas.signal("sealed", "go", 1), UndecryptableRecord),
    ("signal: bad reason", lambda w: w.sagas.signal("wait", "go", reason="a\nb"),
     SagaValidationError),
    ("signal: bad actor", lambda w: w.sagas.signal("wait", "go", actor="x" * 300),
     SagaValidationError),
    ("signal: bad signal id", lambda w: w.sagas.signal("wait", "go", signal_id="has space"),
     SagaValidationError),
    ("signal: payload not JSON", lambda w: w.sagas.signal("wait", "go", {1, 2}),
     SagaValidationError),
    ("signal: past the byte limit", lambda w: w.sagas.signal("heavy", "other", "x" * 300),
     SignalLimitExceeded),
    ("signal: record too large", lambda w: w.sagas.signal("bulky", "other", "x" * 2000),
     PayloadTooLarge),
    ("cancel: no saga", lambda w: w.sagas.cancel("missing"), SagaNotFound),
    ("cancel: unresolved step", lambda w: w.sagas.cancel("review"), SagaResolutionError),
    ("cancel: undecryptable", lambda w: w.sagas.cancel("sealed"), UndecryptableRecord),
    ("cancel: bad actor", lambda w: w.sagas.cancel("wait", actor="x" * 300), SagaValidationError),
    ("cancel: bad reason", lambda w: w.sagas.cancel("wait", reason="a\nb"), SagaValidationError),
    ("cancel: bad id", lambda w: w.sagas.cancel("has space"), SagaValidationError),
    ("resume: bad actor", lambda w: w.sagas.resume("review", actor="x" * 300),
     SagaValidationError),
    ("resume: bad reason", lambda w: w.sagas.resume("review", reason="a\nb"),
     SagaValidationError),
    ("resume: no saga", lambda w: w.sagas.resume("missing"), SagaNotFound),
    ("resume: unresolved step", lambda w: w.sagas.resume("review"), SagaResolutionError),
    ("resume: undecryptable", lambda w: w.sagas.resume("sealed"), UndecryptableRecord),
    ("resolve: stale effect id",
     lambda w: w.sagas.resolve("review", "shop.charge", str(uuid.uuid4()), "committed", result={}),
     SagaResolutionError),
    ("resolve: bad outcome",
     lambda w: w.sagas.resolve("review", "shop.charge", w.review_effect, "maybe"),
     SagaResolutionError),
    ("resolve: result not JSON",
     lambda w: w.sagas.resolve("review", "shop.charge", w.review_effect, "committed",
                               result={1, 2}), SagaValidationError),
    ("resolve: result too large",
     lambda w: w.sagas.resolve("review", "shop.charge", w.review_effect, "committed",
                               result="x" * 9000), PayloadTooLarge),
    ("resolve: no saga",
     lambda w: w.sagas.resolve("missing", "shop.charge", w.review_effect, "committed", result={}),
     SagaNotFound),
    ("resolve: undecryptable",
     lambda w: w.sagas.resolve("sealed", "shop.charge", w.review_effect, "committed", result={}),
     UndecryptableRecord),
    ("resolve: bad step name",
     lambda w: w.sagas.resolve("review", "no spaces!", w.review_effect, "committed", result={}),
     SagaValidationError),
    ("resolve: unknown step",
     lambda w: w.sagas.resolve("review", "shop.nope", w.review_effect, "committed", result={}),
     SagaResolutionError),
    ("resolve: bad effect id",
     lambda w: w.sagas.resolve("review", "shop.charge", "has space", "committed", result={}),
     SagaValidationError),
    ("resolve: step not ambiguous",
     lambda w: w.sagas.resolve("done", "shop.charge", w.done_effect, "committed", result={}),
     SagaResolutionError),
    ("resolve: bad error code",
     lambda w: w.sagas.resolve("review", "shop.charge", w.review_effect, "not-committed",
                               error_code="has space"), SagaValidationError),
    ("resolve: bad reason",
     lambda w: w.sagas.resolve("review", "shop.charge", w.review_effect, "committed", result={},
                               reason="a\nb"), SagaValidationError),
    ("approve: another tenant", _decide("approval_id", "t2", "approved"), ApprovalError),
    ("approve: already decided", _decide("decided_id", "t1", "approved"), ApprovalDecisionError),
    ("deny: already decided", _decide("decided_id", "t1", "denied"), ApprovalDecisionError),
    ("approve: bad decision", _decide("approval_id", "t1", "perhaps"), SagaValidationError),
    ("deny: bad reason", _decide("approval_id", "t1", "denied", reason=""), SagaValidationError),
    ("approve: no approval", _decide("no-such-approval", "t1", "approved"),
     ApprovalDecisionError),
    ("approve: expired", _later(_decide("approval_id", "t1", "approved")), ApprovalTokenExpired),
    ("deny: expired", _later(_decide("approval_id", "t1", "denied")), ApprovalTokenExpired),
    ("approve: gate closed", _decide("closed_id", "t1", "approved"), ApprovalDecisionError),
    ("deny: gate closed", _decide("closed_id", "t1", "denied"), ApprovalDecisionError),
    ("approve: bad decider", _decide("approval_id", "t1", "approved", by=""),
     SagaValidationError),
    ("deny: bad tenant", _decide("approval_id", "", "denied"), SagaValidationError),
    ("approval resume: not a token",
     lambda w: w.sagas.approvals.resume("gate", "not-a-token", **GATE), ApprovalTokenInvalid),
    ("approval resume: another saga's token", _token("gate", of="gate-2"),
     ApprovalTokenInvalid),
    ("approval resume: another principal", _token("gate-2", principal_id="p2"),
     ApprovalBindingError),
    ("approval resume: another tenant", _token("gate-2", tenant_id="t2"), ApprovalBindingError),
    ("approval resume: pending", _token("gate"), ApprovalPending),
    ("approval resume: denied", _token("gate-3"), ApprovalDenied),
    ("approval resume: used", _token("gate-4"), ApprovalTokenReplay),
    ("approval resume: expired", _later(_token("gate-2")), ApprovalTokenExpired),
    ("approval resume: no saga", lambda w: w.sagas.approvals.resume("missing", w.tokens["gate"],
                                                                    **GATE), SagaNotFound),
    ("reseal: no keys", lambda w: w.sagas.reseal(), SagaConfigurationError),
    ("reseal: bad state", lambda w: w.keyed.reseal(states=["nope"]), SagaValidationError),
    ("reseal: bad limit", lambda w: w.keyed.reseal(limit=0), SagaValidationError),
    ("reseal: bad cursor", lambda w: w.keyed.reseal(cursor="not a cursor"), SagaValidationError),
]


@pytest.mark.parametrize("case, call, error", CASES, ids=[c[0] for c in CASES])
def test_a_call_that_raises_writes_nothing(world: World, case: str,
                                           call: Callable[[World], Any],
                                           error: type[Exception]) -> None:
    # given
    before = world.dump()

    # when
    with pytest.raises(error):
        call(world)

    # then
    assert world.dump() == before, case


# (case, command line, the exit code); the command line is made before the first dump
COMMANDS: list[tuple[str, Callable[[World], list[str]], int]] = [
    ("signal: final saga", lambda w: ["signal", "done", "go"], 1),
    ("signal: past the limit", lambda w: ["signal", "full", "other", "--payload", "4"], 1),
    ("signal: undecryptable", lambda w: ["signal", "sealed", "go"], 1),
    ("signal: no saga", lambda w: ["signal", "missing", "go"], 3),
    ("signal: bad payload", lambda w: ["signal", "wait", "go", "--payload", "{nope"], 2),
    ("signal: bad name", lambda w: ["signal", "wait", "no spaces!"], 2),
    ("signal: bad signal id", lambda w: ["signal", "wait", "go", "--signal-id", "has space"], 2),
    ("signal: payload too large",
     lambda w: ["signal", "wait", "go", "--payload", json.dumps("x" * 3000)], 2),
    ("signal: past the byte limit",
     lambda w: ["signal", "heavy", "other", "--payload", json.dumps("x" * 300)], 1),
    ("signal: record too large",
     lambda w: ["signal", "bulky", "other", "--payload", json.dumps("x" * 2000)], 2),
    ("signal: bad reason", lambda w: ["signal", "wait", "go", "--reason", "a\nb"], 2),
    ("cancel: final saga", lambda w: ["cancel", "done"], 1),
    ("cancel: unresolved step", lambda w: ["cancel", "review"], 1),
    ("cancel: undecryptable", lambda w: ["cancel", "sealed"], 1),
    ("cancel: no saga", lambda w: ["cancel", "missing"], 3),
    ("cancel: bad reason", lambda w: ["cancel", "wait", "--reason", "a\nb"], 2),
    ("resume: final saga", lambda w: ["resume", "done"], 1),
    ("resume: undecryptable", lambda w: ["resume", "sealed"], 1),
    ("resume: bad actor", lambda w: ["resume", "review", "--actor", "x" * 300], 2),
    ("resume: unresolved step", lambda w: ["resume", "review"], 1),
    ("resume: no saga", lambda w: ["resume", "missing"], 3),
    ("resolve: stale effect id",
     lambda w: ["resolve", "review", "--step", "shop.charge", "--effect-id", str(uuid.uuid4()),
                "--committed", "--result", "{}"], 1),
    ("resolve: no result",
     lambda w: ["resolve", "review", "--step", "shop.charge", "--effect-id", w.review_effect,
                "--committed"], 2),
    ("resolve: no saga",
     lambda w: ["resolve", "missing", "--step", "shop.charge", "--effect-id", w.review_effect,
                "--committed", "--result", "{}"], 3),
    ("resolve: unknown step",
     lambda w: ["resolve", "review", "--step", "shop.nope", "--effect-id", w.review_effect,
                "--committed", "--result", "{}"], 1),
    ("resolve: step not ambiguous",
     lambda w: ["resolve", "done", "--step", "shop.charge", "--effect-id", w.done_effect,
                "--not-committed"], 1),
    ("resolve: two outcomes",
     lambda w: ["resolve", "review", "--step", "shop.charge", "--effect-id", w.review_effect,
                "--committed", "--not-committed", "--result", "{}"], 2),
    ("resolve: result not JSON",
     lambda w: ["resolve", "review", "--step", "shop.charge", "--effect-id", w.review_effect,
                "--committed", "--result", "{nope"], 2),
    ("resolve: result too large",
     lambda w: ["resolve", "review", "--step", "shop.charge", "--effect-id", w.review_effect,
                "--committed", "--result", json.dumps("x" * 9000)], 2),
    ("resolve: bad error code",
     lambda w: ["resolve", "review", "--step", "shop.charge", "--effect-id", w.review_effect,
                "--not-committed", "--error-code", "has space"], 2),
    ("resolve: undecryptable",
     lambda w: ["resolve", "sealed", "--step", "shop.charge", "--effect-id", w.review_effect,
                "--committed", "--result", "{}"], 1),
    ("approve: already decided", lambda w: ["approve", w.decided_id, "--tenant", "t1",
                                            "--by", "mgr"], 1),
    ("deny: another tenant", lambda w: ["deny", w.approval_id, "--tenant", "t2", "--by", "mgr"],
     1),
    ("reseal: no keys", lambda w: ["reseal"], 2),
    ("reseal: bad limit", lambda w: ["reseal", "--limit", "0"], 2),
    ("reseal: bad state", lambda w: ["reseal", "--state", "nope"], 2),
    ("approve: no approval", lambda w: ["approve", "missing", "--tenant", "t1", "--by", "mgr"], 3),
    ("approve: another tenant", lambda w: ["approve", w.approval_id, "--tenant", "t2",
                                           "--by", "mgr"], 1),
    ("approve: gate closed", lambda w: ["approve", w.closed_id, "--tenant", "t1", "--by", "mgr"],
     1),
    ("approve: expired", lambda w: (w.clock.advance(PAST_EXPIRY_MS),
                                    ["approve", w.approval_id, "--tenant", "t1", "--by", "mgr"])[1],
     1),
    ("approve: bad reason", lambda w: ["approve", w.approval_id, "--tenant", "t1", "--by", "mgr",
                                       "--reason", "a\nb"], 2),
    ("deny: already decided", lambda w: ["deny", w.decided_id, "--tenant", "t1", "--by", "mgr"],
     1),
    ("deny: no approval", lambda w: ["deny", "missing", "--tenant", "t1", "--by", "mgr"], 3),
    ("deny: bad decider", lambda w: ["deny", w.approval_id, "--tenant", "t1", "--by", ""], 2),
    ("sweep: lease held elsewhere", lambda w: (_hold_every_bucket(w), ["sweep"])[1], 1),
]


def _hold_every_bucket(w: World) -> None:
    """Another sweeper holds the sweep lease of every bucket of the store."""
    leases = Leases(w.sagas.store, w.clock, owner="other-host:1")
    for bucket in range(w.sagas.store.buckets):
        assert leases.acquire(SWEEP_LEASE, 60_000, bucket=bucket) is not None


@pytest.mark.parametrize("case, argv, code", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_command_that_fails_writes_nothing(world: World, case: str,
                                             argv: Callable[[World], list[str]],
                                             code: int) -> None:
    # given (the command line first: making it may take a lease or move the clock)
    args = argv(world)
    before = world.dump()

    # when
    result = CliRunner().invoke(sagas_cli, args, obj=Session(app=world.app))

    # then
    assert result.exit_code == code, (result.output, result.exception)
    assert world.dump() == before, case
