"""A call that raises has written nothing (docs/errors.md): every public call that writes
(start, signal, cancel, resume, resolve, approve, deny, reseal, and the CLI commands over them)
is made to raise each error it can raise, on the memory store, SQLite and Redis, and a dump of the
whole store before and after must be equal. The web actions have their own matrix
(tests/web/test_nothing_written.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_sagas import MemoryStore, Sagas
from celery_sagas._records import SagaState
from celery_sagas.cli import Session
from celery_sagas.cli import sagas as sagas_cli
from celery_sagas.errors import (
    ApprovalDecisionError,
    ApprovalError,
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

SECRET = "s" * 40
KEY = "3ZkPZb0bCaQb5-j0pXM0N2z6XqQxFwCO4JvQn8fXq0U="


@dataclass
class World:
    """Sagas in every state a refusal needs, on one store, and a way to dump that store."""

    sagas: Sagas
    app: Celery
    dump: Callable[[], Any]
    review_effect: str
    approval_id: str
    decided_id: str
    keyed: Sagas  # another process's Sagas on the same store, with an encryption key


def _memory_dump(store: MemoryStore) -> Callable[[], Any]:
    return lambda: {k: (e.version, e.state, e.body, e.notes) for k, e in store._records.items()}


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


@pytest.fixture(params=["memory", "sqlite", "redis"])
def world(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[World]:
    if request.param == "memory":
        store: Any = MemoryStore()
        dump = _memory_dump(store)
    elif request.param == "sqlite":
        store = open_store(f"sqlite:///{tmp_path}/sagas.db")
        dump = _sql_dump(store)
    else:
        url = request.getfixturevalue("redis_url")
        store = open_store(url, key_prefix=f"nw{uuid.uuid4().hex[:8]}",
                           require_aof=False)  # the test Redis runs without AOF
        dump = _redis_dump(store)
    try:
        yield _build(store, dump)
    finally:
        if request.param == "redis":
            from tests.e2e.conftest import wipe_store

            wipe_store(store)
        if request.param != "memory":
            store.close()


def _build(store: Any, dump: Callable[[], Any]) -> World:
    clock = FrozenClock()
    app = Celery(f"nw-{uuid.uuid4().hex[:8]}", set_as_current=False)
    sagas = Sagas(app, store=store, allow_non_durable=True, clock=clock, payload_limit=8192,
                  signal_limit=3, approval_secrets=[SECRET])
    script = Script()
    _, definitions = _define(sagas, script)
    driver = SagaDriver(sagas)
    definitions["place-order"].start(ORDER, saga_id="done")
    definitions["waiter"].start({}, saga_id="wait")
    definitions["waiter"].start({}, saga_id="full")
    driver.run_until_idle()
    script.then("charge", ConnectionError("reset after the request left"))
    definitions["place-order"].start({**ORDER, "id": "o-2"}, saga_id="review")
    definitions["gated"].start({}, saga_id="gate")
    definitions["gated"].start({}, saga_id="gate-2")
    driver.run_until_idle()
    for i in range(3):
        sagas.signal("full", "other", i)
    [pending] = sagas.approvals.pending("gate")
    [decided] = sagas.approvals.pending("gate-2")
    sagas.approvals.decide(decided.approval_id, tenant_id="t1", decision="approved",
                           decided_by="mgr")
    keyed = _sealed_saga(store, clock)
    review = sagas.get("review")
    assert review is not None and review.state is SagaState.MANUAL_REVIEW
    effect = review.steps[1].effect_id
    return World(sagas, app, dump, effect, pending.approval_id, decided.approval_id, keyed)


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
    _define(sealer, Script())[1]["waiter"].start({"secret": 1}, saga_id="sealed")
    SagaDriver(sealer).run_until_idle()
    return sealer


def _decide(which: str, tenant: str, decision: str, **more: Any) -> Callable[[World], Any]:
    """A decision on the world's pending (``which="approval_id"``) or decided approval."""
    return lambda w: w.sagas.approvals.decide(getattr(w, which), tenant_id=tenant,
                                              decision=decision, decided_by="mgr", **more)


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
    ("cancel: no saga", lambda w: w.sagas.cancel("missing"), SagaNotFound),
    ("cancel: unresolved step", lambda w: w.sagas.cancel("review"), SagaResolutionError),
    ("cancel: undecryptable", lambda w: w.sagas.cancel("sealed"), UndecryptableRecord),
    ("cancel: bad actor", lambda w: w.sagas.cancel("wait", actor="x" * 300), SagaValidationError),
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
    ("approve: another tenant", _decide("approval_id", "t2", "approved"), ApprovalError),
    ("approve: already decided", _decide("decided_id", "t1", "approved"), ApprovalDecisionError),
    ("deny: already decided", _decide("decided_id", "t1", "denied"), ApprovalDecisionError),
    ("approve: bad decision", _decide("approval_id", "t1", "perhaps"), SagaValidationError),
    ("deny: bad reason", _decide("approval_id", "t1", "denied", reason=""), SagaValidationError),
    ("reseal: no keys", lambda w: w.sagas.reseal(), SagaConfigurationError),
    ("reseal: bad state", lambda w: w.keyed.reseal(states=["nope"]), SagaValidationError),
    ("reseal: bad limit", lambda w: w.keyed.reseal(limit=0), SagaValidationError),
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


# (case, command line, the exit code)
COMMANDS: list[tuple[str, Callable[[World], list[str]], int]] = [
    ("signal: final saga", lambda w: ["signal", "done", "go"], 1),
    ("signal: past the limit", lambda w: ["signal", "full", "other", "--payload", "4"], 1),
    ("signal: undecryptable", lambda w: ["signal", "sealed", "go"], 1),
    ("signal: no saga", lambda w: ["signal", "missing", "go"], 3),
    ("signal: bad payload", lambda w: ["signal", "wait", "go", "--payload", "{nope"], 2),
    ("cancel: final saga", lambda w: ["cancel", "done"], 1),
    ("cancel: unresolved step", lambda w: ["cancel", "review"], 1),
    ("cancel: undecryptable", lambda w: ["cancel", "sealed"], 1),
    ("resume: unresolved step", lambda w: ["resume", "review"], 1),
    ("resume: no saga", lambda w: ["resume", "missing"], 3),
    ("resolve: stale effect id",
     lambda w: ["resolve", "review", "--step", "shop.charge", "--effect-id", str(uuid.uuid4()),
                "--committed", "--result", "{}"], 1),
    ("resolve: no result",
     lambda w: ["resolve", "review", "--step", "shop.charge", "--effect-id", w.review_effect,
                "--committed"], 2),
    ("approve: already decided", lambda w: ["approve", w.decided_id, "--tenant", "t1",
                                            "--by", "mgr"], 1),
    ("deny: another tenant", lambda w: ["deny", w.approval_id, "--tenant", "t2", "--by", "mgr"],
     1),
    ("reseal: no keys", lambda w: ["reseal"], 2),
    ("reseal: bad limit", lambda w: ["reseal", "--limit", "0"], 2),
    ("approve: no approval", lambda w: ["approve", "missing", "--tenant", "t1", "--by", "mgr"], 3),
]


@pytest.mark.parametrize("case, argv, code", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_command_that_fails_writes_nothing(world: World, case: str,
                                             argv: Callable[[World], list[str]],
                                             code: int) -> None:
    # given
    before = world.dump()

    # when
    result = CliRunner().invoke(sagas_cli, argv(world), obj=Session(app=world.app))

    # then
    assert result.exit_code == code, (result.output, result.exception)
    assert world.dump() == before, case
