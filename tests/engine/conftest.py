"""Engine test fixtures: sagas driven in-process, deterministic and fast.

Each test gets a fresh Celery app without a broker, a ``Sagas`` on a ``MemoryStore`` with a
``FrozenClock``, and a ``SagaDriver`` that records every message instead of sending it and
delivers it, on demand, through the real task classes (claim, body, commit, continuation).

The ``shop`` fixture registers a small order saga (reserve -> charge -> ship, each with a
compensator) and two idempotent steps: ``notify`` (retried at once, inside the delivery) and
``sync`` (retried a minute later, by the sweep). Every body asks a ``Script`` what to do, so a
test says up front which call fails, raises or re-enters the engine, and reads back exactly
which bodies ran with which arguments.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery

from celery_sagas import MemoryStore, Sagas, StepNotCommitted
from celery_sagas._events import LifecycleEvent
from celery_sagas._liveness import claimer_id
from celery_sagas._protocol import moves
from celery_sagas._records import SagaRecord, SagaState, StepRecord
from celery_sagas._sweep import SweepReport
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.dispatcher import Sent
from celery_sagas.testing.driver import SagaDriver

ORDER: dict[str, Any] = {"id": "o-1", "sku": "sku-1", "qty": 2, "card": "card-1", "total": 30}
HOST = claimer_id().rpartition(":")[0]
SYNC_BACKOFF_MS = 60_000


class CardDeclined(Exception):
    """A provider answer that proves the charge did not happen (declared not_committed_on)."""


@dataclass
class BodyCall:
    """One call of a step or compensator body, as the body saw it."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class Script:
    """What each body does on its next calls; every call is recorded in order."""

    calls: list[BodyCall] = field(default_factory=list)
    _next: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))

    def then(self, name: str, *outcomes: Any) -> None:
        """Queue outcomes for the next calls of ``name``: raise an exception, call a callable,
        or return any other value. Once the queue is empty the body's default result is used."""
        self._next[name].extend(outcomes)

    def play(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], default: Any) -> Any:
        """Record the call and act out the next queued outcome (or return ``default``)."""
        self.calls.append(BodyCall(name, args, dict(kwargs)))
        queued = self._next[name]
        outcome = queued.pop(0) if queued else default
        if isinstance(outcome, BaseException):
            raise outcome
        if callable(outcome):
            return outcome()
        return outcome

    def names(self) -> list[str]:
        """The names of the bodies that ran, in order."""
        return [call.name for call in self.calls]

    def of(self, name: str) -> list[BodyCall]:
        """Every call of one body."""
        return [call for call in self.calls if call.name == name]


@dataclass
class Shop:
    """The registered tasks and definitions of the test shop, plus helpers to drive them."""

    sagas: Sagas
    driver: SagaDriver
    clock: FrozenClock
    script: Script
    tasks: dict[str, Any]
    definitions: dict[str, Any]

    @property
    def place_order(self) -> Any:
        """reserve -> charge -> ship."""
        return self.definitions["place-order"]

    @property
    def notify_user(self) -> Any:
        """One idempotent step whose retries are due at once (run within the delivery)."""
        return self.definitions["notify-user"]

    @property
    def sync_user(self) -> Any:
        """One idempotent step whose retries are due after a minute (sent by the sweep)."""
        return self.definitions["sync-user"]

    def start_order(self, saga_id: str = "o-1", **changes: Any) -> SagaRecord:
        """Start place-order with the default order (changed by ``changes``)."""
        return self.place_order.start({**ORDER, **changes}, saga_id=saga_id).record

    def record(self, saga_id: str = "o-1") -> SagaRecord:
        """The stored saga record (it must exist)."""
        return self.sagas.engine.load(saga_id)

    def step(self, name: str, saga_id: str = "o-1") -> StepRecord:
        """A stored step record (it must exist)."""
        step = self.record(saga_id).step(name)
        assert step is not None, f"no step {name!r}"
        return step

    def deliver_next(self) -> list[Sent]:
        """Take every pending message, deliver them in order, and return them."""
        taken = self.driver.take()
        for message in taken:
            self.driver.deliver(message)
        return taken

    def sweep_when_stale(self) -> SweepReport:
        """Move time just past the staleness limit, then run one sweep."""
        self.clock.advance(self.sagas.settings.timing.stale_ms + 1)
        return self.sagas.sweep()

    def refund_pending(self) -> Sent:
        """Run an order whose ship is declined; return refund's undelivered message."""
        self.script.then("ship", StepNotCommitted("out_of_stock"))
        self.start_order()
        for _ in range(3):  # reserve, charge, ship
            self.deliver_next()
        [message] = self.driver.take()
        assert (message.kind, message.step) == ("compensation", "shop.charge")
        return message

    def define_refusing(self, name: str, **policy: Any) -> Any:
        """A definition that reserves, then refuses to go on (run() raises StepNotCommitted)."""
        reserve = self.tasks["reserve"]

        def run(ctx: Any, _: Any) -> Any:
            ctx.step(reserve, "sku-1", 1)
            raise StepNotCommitted("over_budget")

        return self.sagas.saga(name, **policy)(run)

    def claim_as(self, claimer: str, step: str, saga_id: str = "o-1", compensation: bool = False) -> None:
        """Write a start claim by ``claimer`` with a CAS, as if its task had begun the body."""
        engine = self.sagas.engine
        saga = engine.load(saga_id)
        record = saga.step(step)
        assert record is not None
        now = engine.now()
        if compensation:
            after = moves.claim_compensation(saga, step, record.compensation_effect_id, claimer, now)
        else:
            after = moves.claim_step(saga, step, record.effect_id, claimer, now)
        engine.repository.write(saga, after)


@pytest.fixture
def clock() -> FrozenClock:
    """Time that moves only when the test says so."""
    return FrozenClock()


@pytest.fixture
def store() -> MemoryStore:
    """A fresh reference store."""
    return MemoryStore()


@pytest.fixture
def app() -> Celery:
    """A Celery app on the in-memory transport: nothing leaves the process (without a broker
    URL Celery would publish to an AMQP broker on localhost)."""
    return Celery(f"engine-{uuid.uuid4().hex[:8]}", broker="memory://", set_as_current=False)


@pytest.fixture
def sagas(app: Celery, store: MemoryStore, clock: FrozenClock) -> Sagas:
    """Sagas on the memory store and the frozen clock."""
    return Sagas(app, store=store, allow_non_durable=True, clock=clock)


@pytest.fixture
def driver(sagas: Sagas) -> SagaDriver:
    """Records messages and delivers them through the real task classes."""
    return SagaDriver(sagas)


@pytest.fixture
def script() -> Script:
    """The plan the shop's bodies follow."""
    return Script()


@pytest.fixture
def events(sagas: Sagas) -> Iterator[list[LifecycleEvent]]:
    """Every lifecycle event emitted during the test."""
    seen: list[LifecycleEvent] = []
    unsubscribe = sagas.subscribe(seen.append)
    yield seen
    unsubscribe()


def register_shop(sagas: Sagas, script: Script) -> tuple[dict[str, Any], dict[str, Any]]:
    """Register the shop's steps, compensators and two definitions on ``sagas``."""

    @sagas.step(name="shop.reserve", compensate="shop.release")
    def reserve(sku: str, qty: int, *, warehouse: str = "main", saga: Any = None) -> Any:
        return script.play("reserve", (sku, qty), {"warehouse": warehouse, "saga": saga},
                           {"reservation": f"r-{sku}"})

    @sagas.compensator(name="shop.release")
    def release(sku: str, qty: int, *, warehouse: str = "main", result: Any = None, saga: Any = None) -> Any:
        return script.play("release", (sku, qty),
                           {"warehouse": warehouse, "result": result, "saga": saga}, None)

    @sagas.step(name="shop.charge", compensate="shop.refund", not_committed_on=(CardDeclined,))
    def charge(card: str, total: int, *, saga: Any = None) -> Any:
        return script.play("charge", (card, total), {"saga": saga}, {"charge": f"ch-{card}"})

    @sagas.compensator(name="shop.refund")
    def refund(card: str, total: int, *, result: Any = None, saga: Any = None) -> Any:
        return script.play("refund", (card, total), {"result": result, "saga": saga}, None)

    @sagas.step(name="shop.ship", compensate="shop.unship", time_limit=10)
    def ship(order_id: str, reservation: str, *, saga: Any = None) -> Any:
        return script.play("ship", (order_id, reservation), {"saga": saga}, {"parcel": f"p-{order_id}"})

    @sagas.compensator(name="shop.unship")
    def unship(order_id: str, reservation: str, *, result: Any = None, saga: Any = None) -> Any:
        return script.play("unship", (order_id, reservation), {"result": result, "saga": saga}, None)

    @sagas.step(name="shop.notify", compensate=None, idempotent=True, retries=2, backoff=lambda _: 0)
    def notify(user: str, *, saga: Any = None) -> Any:
        return script.play("notify", (user,), {"saga": saga}, {"sent": user})

    @sagas.step(name="shop.sync", compensate=None, idempotent=True, retries=2,
                backoff=lambda _: SYNC_BACKOFF_MS / 1000)
    def sync(user: str, *, saga: Any = None) -> Any:
        return script.play("sync", (user,), {"saga": saga}, {"synced": user})

    @sagas.saga("place-order")
    def place_order(ctx: Any, order: dict[str, Any]) -> Any:
        stock = ctx.step(reserve, order["sku"], order["qty"], warehouse="east")
        ctx.step(charge, order["card"], order["total"])
        return ctx.step(ship, order["id"], stock["reservation"])

    @sagas.saga("notify-user")
    def notify_user(ctx: Any, data: dict[str, Any]) -> Any:
        return ctx.step(notify, data["user"])

    @sagas.saga("sync-user")
    def sync_user(ctx: Any, data: dict[str, Any]) -> Any:
        return ctx.step(sync, data["user"])

    tasks = {"reserve": reserve, "release": release, "charge": charge, "refund": refund,
             "ship": ship, "unship": unship, "notify": notify, "sync": sync}
    return tasks, {"place-order": place_order, "notify-user": notify_user, "sync-user": sync_user}


@pytest.fixture
def shop(sagas: Sagas, driver: SagaDriver, clock: FrozenClock, script: Script) -> Shop:
    """The test shop, registered on ``sagas``."""
    tasks, definitions = register_shop(sagas, script)
    return Shop(sagas, driver, clock, script, tasks, definitions)


@pytest.fixture(scope="session")
def dead_pid() -> int:
    """The pid of a process of this host that has exited (its claims are provably gone)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert child.pid != os.getpid()
    return child.pid


def saga_states() -> list[str]:
    """Every saga state name (for scans that must see every record)."""
    return [str(state) for state in SagaState]


def nothing_stored(store: MemoryStore) -> bool:
    """True when no saga record of any state is in the store."""
    return store.scan("saga", saga_states(), limit=1000).items == ()


def kinds(messages: list[Sent]) -> list[tuple[str, str | None]]:
    """(kind, step) of each message, for readable assertions."""
    return [(m.kind, m.step) for m in messages]

