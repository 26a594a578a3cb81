"""Paged scans of decoded records (SPEC §5): corrupt records reported, never raised."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from celery_sagas._records import (
    EffectRecord,
    EffectState,
    SagaRecord,
    SagaState,
    effect_to_envelope,
    saga_to_envelope,
)
from celery_sagas._scans import (
    CorruptRecord,
    all_approvals,
    all_effects,
    all_sagas,
    scan_approvals,
    scan_effects,
    scan_sagas,
)
from celery_sagas.errors import SagaValidationError
from celery_sagas.stores.base import Envelope, Page
from celery_sagas.stores.memory import MemoryStore

T0 = 1_700_000_000_000


class ShortPages(MemoryStore):
    """Returns at most 7 records a page whatever the limit, as a bucketed store may."""

    def scan(
        self,
        kind: str,
        states: Sequence[str],
        *,
        updated_before_ms: int | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        return super().scan(
            kind, states, updated_before_ms=updated_before_ms, cursor=cursor, limit=min(limit, 7)
        )


class WrongStates(MemoryStore):
    """A broken store that ignores the states asked for."""

    def scan(self, kind: str, states: Sequence[str], **kwargs: Any) -> Page:
        return super().scan(kind, [s.value for s in SagaState], **kwargs)


def saga(saga_id: str, state: SagaState = SagaState.RUNNING, at: int = T0) -> SagaRecord:
    return SagaRecord(saga_id, "demo", state, {"n": 1}, at, at)


def effect(effect_id: str, at: int = T0) -> EffectRecord:
    return EffectRecord(effect_id, "orders.charge", EffectState.EXECUTING, at, at)


def corrupt(store: MemoryStore, kind: str, record_id: str, body: str = "not json {") -> None:
    with store._lock:
        store._records[(kind, record_id)] = replace(store._records[(kind, record_id)], body=body)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


def test_scan_sagas_returns_decoded_records(store: MemoryStore) -> None:
    store.create(saga_to_envelope(saga("s1")))
    store.create(saga_to_envelope(saga("s2", SagaState.COMPLETED)))
    page = scan_sagas(store, [SagaState.RUNNING])
    assert page.records == (saga("s1"),) and page.corrupt == () and page.cursor is None


def test_a_corrupt_record_is_returned_apart_not_raised(store: MemoryStore) -> None:
    for name in ("s1", "s2", "s3"):
        store.create(saga_to_envelope(saga(name)))
    corrupt(store, "saga", "s2")
    page = scan_sagas(store, ["running"])
    assert [r.saga_id for r in page.records] == ["s1", "s3"]
    assert [(c.kind, c.id) for c in page.corrupt] == [("saga", "s2")]
    assert "JSONDecodeError" in page.corrupt[0].reason


def test_a_record_failing_read_validation_is_corrupt(store: MemoryStore) -> None:
    store.create(effect_to_envelope(effect("e1")))
    corrupt(store, "effect", "e1", '{"capability":"Bad Cap","created_at_ms":1}')
    page = scan_effects(store, [EffectState.EXECUTING])
    assert page.records == () and page.corrupt[0] == CorruptRecord("effect", "e1", "failed read validation")


def test_a_record_of_a_state_not_asked_for_is_reported(store: MemoryStore) -> None:
    broken = WrongStates()
    broken.create(saga_to_envelope(saga("s1", SagaState.COMPLETED)))
    page = scan_sagas(broken, [SagaState.RUNNING])
    assert page.records == () and page.corrupt[0].id == "s1"


def test_scan_pages_with_the_cursor(store: MemoryStore) -> None:
    for i in range(5):
        store.create(effect_to_envelope(effect(f"e{i}", T0 + i)))
    first = scan_effects(store, ["executing"], limit=2)
    second = scan_effects(store, ["executing"], cursor=first.cursor, limit=2)
    third = scan_effects(store, ["executing"], cursor=second.cursor, limit=2)
    ids = [r.effect_id for p in (first, second, third) for r in p.records]
    assert ids == ["e0", "e1", "e2", "e3", "e4"] and third.cursor is None


def test_updated_before_is_passed_to_the_store(store: MemoryStore) -> None:
    store.create(effect_to_envelope(effect("old", T0)))
    store.create(effect_to_envelope(effect("new", T0 + 10)))
    page = scan_effects(store, ["executing"], updated_before_ms=T0 + 10)
    assert [r.effect_id for r in page.records] == ["old"]


def test_repeated_states_are_scanned_once(store: MemoryStore) -> None:
    store.create(saga_to_envelope(saga("s1")))
    assert len(scan_sagas(store, ["running", SagaState.RUNNING]).records) == 1


@pytest.mark.parametrize("states", [[], "running", ["runing"], ["pending"]], ids=repr)
def test_unknown_states_are_refused(store: MemoryStore, states: Any) -> None:
    with pytest.raises(SagaValidationError):
        scan_sagas(store, states)


def test_approval_states_are_checked_against_approvals(store: MemoryStore) -> None:
    with pytest.raises(SagaValidationError):
        scan_approvals(store, ["running"])
    assert scan_approvals(store, ["pending"]).records == ()


@pytest.mark.parametrize("limit", [0, 1001, -1, True])
def test_bad_limits_raise(store: MemoryStore, limit: Any) -> None:
    with pytest.raises(SagaValidationError):
        scan_sagas(store, ["running"], limit=limit)


def fill(store: MemoryStore, count: int) -> None:
    for i in range(count):
        store.create(Envelope("effect", f"e{i:05d}", 1, "unknown", T0, "{}"))


@pytest.mark.parametrize("make", [MemoryStore, ShortPages])
def test_all_returns_up_to_1000_matches(make: type[MemoryStore]) -> None:
    store = make()
    fill(store, 1000)
    found = all_effects(store, ["unknown"])
    assert len(found.corrupt) == 1000 and found.cursor is None  # bodies are "{}": corrupt


@pytest.mark.parametrize("make", [MemoryStore, ShortPages])
def test_all_refuses_more_than_1000_matches(make: type[MemoryStore]) -> None:
    store = make()
    fill(store, 1001)
    with pytest.raises(SagaValidationError, match="more than 1000"):
        all_effects(store, ["unknown"])


def test_all_sagas_and_all_approvals_decode(store: MemoryStore) -> None:
    store.create(saga_to_envelope(saga("s1")))
    assert all_sagas(store, ["running"]).records == (saga("s1"),)
    assert all_approvals(store, ["pending"]).records == ()
