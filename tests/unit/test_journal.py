"""The effect journal (SPEC §2.1): admission, CAS transitions, refusals that write nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from celery_sagas._journal import EffectJournal
from celery_sagas._records import EffectRecord, EffectState
from celery_sagas._values import decode_json
from celery_sagas.errors import (
    IllegalTransition,
    InvalidRecordError,
    NonDurableStoreError,
    SagaConcurrencyError,
    SagaConflictError,
    SagaNotFound,
    SagaValidationError,
)
from celery_sagas.stores.base import Envelope
from celery_sagas.stores.memory import MemoryStore
from celery_sagas.testing import FrozenClock, ReadTogether, race

T0 = 1_700_000_000_000
DIGEST = "ab" * 32
THREADS = 16


class DurableMemory(MemoryStore):
    """A memory store that claims durability, to test the journal's acceptance."""

    durable = True


class HookedStore(MemoryStore):
    """Runs ``after_get`` once, right after the next read: a writer slipping in between."""

    def __init__(self) -> None:
        super().__init__()
        self.after_get: Callable[[], Any] | None = None

    def get(self, kind: str, record_id: str) -> Envelope | None:
        found = super().get(kind, record_id)
        hook, self.after_get = self.after_get, None
        if hook is not None:
            hook()
        return found


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0)


@pytest.fixture
def store() -> HookedStore:
    return HookedStore()


@pytest.fixture
def journal(store: MemoryStore, clock: FrozenClock) -> EffectJournal:
    return EffectJournal(store, clock, allow_non_durable=True)


def stored(store: MemoryStore, effect_id: str) -> Envelope | None:
    return store.get("effect", effect_id)


# ------------------------------------------------------------------ durability


def test_a_non_durable_store_is_refused_by_default(clock: FrozenClock) -> None:
    with pytest.raises(NonDurableStoreError):
        EffectJournal(MemoryStore(), clock)


def test_a_durable_store_is_accepted(clock: FrozenClock) -> None:
    journal = EffectJournal(DurableMemory(), clock)
    assert journal.admit("e1", "orders.charge").state is EffectState.ADMISSION


# ------------------------------------------------------------------ admission


def test_admit_records_the_effect_in_admission(journal: EffectJournal) -> None:
    record = journal.admit(
        "e1",
        "orders.charge",
        target="card-7",
        digest=DIGEST,
        tenant_id="t1",
        principal_id="alice",
        saga_id="order-42",
        step="charge",
        stage="execution",
    )
    assert (record.state, record.version) == (EffectState.ADMISSION, 1)
    assert record.created_at_ms == record.updated_at_ms == T0
    assert (record.target, record.digest, record.tenant_id) == ("card-7", DIGEST, "t1")
    assert journal.get("e1") == record


def test_admitting_the_same_effect_again_returns_the_stored_record(
    journal: EffectJournal, clock: FrozenClock
) -> None:
    journal.admit("e1", "orders.charge", saga_id="s1")
    began = journal.begin("e1")
    clock.advance(5)
    assert journal.admit("e1", "orders.charge", saga_id="s1") == began


def test_admitting_an_effect_id_with_other_values_is_a_conflict(
    journal: EffectJournal, store: MemoryStore
) -> None:
    journal.admit("e1", "orders.charge", target="card-7")
    before = stored(store, "e1")
    with pytest.raises(SagaConflictError):
        journal.admit("e1", "orders.charge", target="card-8")
    assert stored(store, "e1") == before


@pytest.mark.parametrize(
    "effect_id, kwargs",
    [
        ("bad id", {}),
        ("e" * 65, {}),
        ("e1", {"capability": "Orders.Charge"}),
        ("e1", {"target": "has space"}),
        ("e1", {"digest": "ABC"}),
        ("e1", {"tenant_id": "t1"}),
        ("e1", {"principal_id": "alice"}),
        ("e1", {"tenant_id": "t 1", "principal_id": "alice"}),
        ("e1", {"saga_id": "s\t1"}),
        ("e1", {"step": "a\nb"}),
        ("e1", {"stage": "bogus"}),
    ],
)
def test_invalid_admission_input_writes_nothing(
    journal: EffectJournal, store: MemoryStore, effect_id: str, kwargs: dict[str, Any]
) -> None:
    capability = kwargs.pop("capability", "orders.charge")
    with pytest.raises(SagaValidationError):
        journal.admit(effect_id, capability, **kwargs)
    assert store.scan("effect", [s.value for s in EffectState]).items == ()


def test_an_invalid_clock_reading_writes_nothing(store: MemoryStore) -> None:
    class BadClock:
        def now_ms(self) -> int:
            return -1

    journal = EffectJournal(store, BadClock(), allow_non_durable=True)
    with pytest.raises(SagaValidationError):
        journal.admit("e1", "orders.charge")
    assert stored(store, "e1") is None


def test_an_effect_record_holds_no_payload(journal: EffectJournal, store: MemoryStore) -> None:
    journal.admit("e1", "orders.charge", saga_id="s1", step="charge", stage="execution")
    journal.begin("e1")
    envelope = stored(store, "e1")
    assert envelope is not None
    assert set(decode_json(envelope.body)) <= {
        "capability", "created_at_ms", "target", "digest", "tenant_id", "principal_id",
        "error_code", "saga_id", "step", "stage", "write_id",
    }  # fmt: skip


# ------------------------------------------------------------------ transitions

PATHS: dict[EffectState, list[str]] = {
    EffectState.ADMISSION: [],
    EffectState.EXECUTING: ["begin"],
    EffectState.COMMITTED: ["begin", "commit"],
    EffectState.FAILED: ["fail"],
    EffectState.UNKNOWN: ["begin", "mark_unknown"],
}


def move(journal: EffectJournal, op: str, effect_id: str = "e1") -> Any:
    if op == "fail":
        return journal.fail(effect_id, "card_declined")
    return getattr(journal, op)(effect_id)


def bring(journal: EffectJournal, state: EffectState) -> None:
    journal.admit("e1", "orders.charge")
    for op in PATHS[state]:
        move(journal, op)


LEGAL = {
    (EffectState.ADMISSION, "begin"): EffectState.EXECUTING,
    (EffectState.ADMISSION, "fail"): EffectState.FAILED,
    (EffectState.EXECUTING, "commit"): EffectState.COMMITTED,
    (EffectState.EXECUTING, "fail"): EffectState.FAILED,
    (EffectState.EXECUTING, "mark_unknown"): EffectState.UNKNOWN,
    (EffectState.UNKNOWN, "commit"): EffectState.COMMITTED,
    (EffectState.UNKNOWN, "fail"): EffectState.FAILED,
}
OPS = ["begin", "commit", "fail", "mark_unknown"]
ILLEGAL = [(s, op) for s in EffectState for op in OPS if (s, op) not in LEGAL]


@pytest.mark.parametrize("start, op", list(LEGAL), ids=str)
def test_a_legal_transition_is_one_cas_write(
    journal: EffectJournal, clock: FrozenClock, start: EffectState, op: str
) -> None:
    bring(journal, start)
    before = journal.get("e1")
    assert before is not None
    clock.advance(10)
    after = move(journal, op)
    assert after.state is LEGAL[(start, op)]
    assert after.version == before.version + 1
    assert after.updated_at_ms == clock.now_ms()
    assert journal.get("e1") == after


@pytest.mark.parametrize("start, op", ILLEGAL, ids=str)
def test_an_illegal_transition_raises_and_writes_nothing(
    journal: EffectJournal, store: MemoryStore, start: EffectState, op: str
) -> None:
    bring(journal, start)
    before = stored(store, "e1")
    with pytest.raises(IllegalTransition):
        move(journal, op)
    assert stored(store, "e1") == before


def test_fail_records_its_error_code(journal: EffectJournal) -> None:
    journal.admit("e1", "orders.charge")
    assert journal.fail("e1", "card_declined").error_code == "card_declined"


def test_mark_unknown_records_an_optional_error_code(journal: EffectJournal) -> None:
    journal.admit("e1", "orders.charge")
    journal.begin("e1")
    assert journal.mark_unknown("e1", "worker_lost").error_code == "worker_lost"


@pytest.mark.parametrize("code", ["", "Bad", "has space", "x" * 65, None])
def test_an_invalid_error_code_writes_nothing(journal: EffectJournal, store: MemoryStore, code: Any) -> None:
    journal.admit("e1", "orders.charge")
    before = stored(store, "e1")
    with pytest.raises(SagaValidationError):
        journal.fail("e1", code)
    assert stored(store, "e1") == before


def test_a_transition_of_a_missing_effect_raises_not_found(journal: EffectJournal) -> None:
    with pytest.raises(SagaNotFound):
        journal.begin("nope")


def test_a_clock_going_backwards_never_moves_updated_at_back(
    journal: EffectJournal, clock: FrozenClock
) -> None:
    journal.admit("e1", "orders.charge")
    clock.set(T0 + 100)
    journal.begin("e1")
    clock.set(T0 + 50)
    committed = journal.commit("e1")
    assert committed.updated_at_ms == T0 + 100
    assert journal.get("e1") == committed


# ------------------------------------------------------------------ races


def test_a_writer_that_lost_the_race_gets_a_concurrency_error(
    journal: EffectJournal, store: HookedStore, clock: FrozenClock
) -> None:
    journal.admit("e1", "orders.charge")
    rival = EffectJournal(store, clock, allow_non_durable=True)
    store.after_get = lambda: rival.fail("e1", "cancelled")
    with pytest.raises(SagaConcurrencyError):
        journal.begin("e1")
    current = journal.get("e1")
    assert current is not None and current.state is EffectState.FAILED


def test_concurrent_begins_exactly_one_wins(store: MemoryStore, clock: FrozenClock) -> None:
    EffectJournal(store, clock, allow_non_durable=True).admit("e1", "orders.charge")
    journal = EffectJournal(ReadTogether(store, THREADS), clock, allow_non_durable=True)
    results = race(lambda i: journal.begin("e1"), THREADS)
    winners = [r for r in results if isinstance(r, EffectRecord)]
    losers = [r for r in results if isinstance(r, SagaConcurrencyError)]
    assert len(winners) == 1 and len(losers) == THREADS - 1, results


# ------------------------------------------------------------------ reads


def test_get_of_a_missing_effect_is_none(journal: EffectJournal) -> None:
    assert journal.get("nope") is None


def test_get_of_a_corrupt_effect_raises_invalid_record(journal: EffectJournal, store: MemoryStore) -> None:
    journal.admit("e1", "orders.charge")
    with store._lock:
        key = ("effect", "e1")
        store._records[key] = replace(store._records[key], body='{"capability":"BAD"}')
    with pytest.raises(InvalidRecordError):
        journal.get("e1")
