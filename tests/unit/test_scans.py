"""Paged scans of decoded records (docs/design.md §5, §6): ``Scans(store, codec)`` over the
store's indexes; corrupt records reported beside the good ones, never raised."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from celery_sagas._codec import Codec
from celery_sagas._protocol.due import due_at
from celery_sagas._records import (
    ApprovalRecord,
    ApprovalState,
    SagaRecord,
    SagaState,
)
from celery_sagas._scans import CorruptRecord, Scans
from celery_sagas.errors import SagaValidationError
from celery_sagas.stores.base import Envelope, Page
from celery_sagas.stores.memory import MemoryStore

from .protocol_builders import CF, XR, step

T0 = 1_700_000_000_000
CODEC = Codec()


class WrongStates(MemoryStore):
    """A broken store that ignores the states asked for."""

    def scan(self, kind: str, states: Any, **kwargs: Any) -> Page:
        return super().scan(kind, [s.value for s in SagaState], **kwargs)


class WrongKind(MemoryStore):
    """A broken store whose due index hands back records of another kind."""

    def scan_due(self, kind: str, **kwargs: Any) -> Page:
        page = super().scan_due(kind, **kwargs)
        return Page(tuple(replace(e, kind="approval") for e in page.items), page.cursor)


class LastWriteOnly(MemoryStore):
    """A store whose ordered scan predates ``by=`` (sorts by last write only)."""

    def scan_ordered(self, kind: str, states: Any, *, label: str | None = None,  # type: ignore[override]
                     updated_before_ms: int | None = None, newest_first: bool = False,
                     cursor: str | None = None, limit: int = 100) -> Page:
        return super().scan_ordered(kind, states, label=label, newest_first=newest_first,
                                    updated_before_ms=updated_before_ms, cursor=cursor,
                                    limit=limit)


def saga(saga_id: str, state: SagaState = SagaState.RUNNING, at: int = T0, definition: str = "demo",
         steps: tuple[Any, ...] = ()) -> SagaRecord:
    return SagaRecord(saga_id, definition, state, {"n": 1}, at, at, steps,
                      rolling_back=state is SagaState.COMPENSATING)


def approval(approval_id: str, at: int = T0) -> ApprovalRecord:
    return ApprovalRecord(approval_id, "e1", "payments.refund", "t1", "alice", "ab" * 32,
                          ApprovalState.PENDING, at, at + 60_000, at)


def put(store: MemoryStore, record: SagaRecord | ApprovalRecord) -> None:
    envelope = CODEC.saga_envelope(record) if isinstance(record, SagaRecord) else \
        CODEC.approval_envelope(record)
    assert store.create(envelope)


def corrupt(store: MemoryStore, kind: str, record_id: str, body: str = "not json {") -> None:
    with store._lock:
        store._records[(kind, record_id)] = replace(store._records[(kind, record_id)], body=body)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


def scans(store: MemoryStore) -> Scans:
    return Scans(store, CODEC)


# ------------------------------------------------------------------ decoding


def test_sagas_returns_decoded_records(store: MemoryStore) -> None:
    put(store, saga("s1"))
    put(store, saga("s2", SagaState.COMPLETED))
    page = scans(store).sagas([SagaState.RUNNING])
    assert page.records == (saga("s1"),) and page.corrupt == () and page.cursor is None


def test_a_corrupt_record_is_returned_apart_not_raised(store: MemoryStore) -> None:
    for name in ("s1", "s2", "s3"):
        put(store, saga(name))
    corrupt(store, "saga", "s2")
    page = scans(store).sagas(["running"])
    assert [r.saga_id for r in page.records] == ["s1", "s3"]
    assert [(c.kind, c.id) for c in page.corrupt] == [("saga", "s2")]
    assert "JSONDecodeError" in page.corrupt[0].reason


def test_a_record_failing_read_validation_is_corrupt(store: MemoryStore) -> None:
    put(store, approval("a1"))
    corrupt(store, "approval", "a1", '{"capability":"Bad Cap","created_at_ms":1}')
    page = scans(store).approvals([ApprovalState.PENDING])
    assert page.records == () and page.corrupt[0] == CorruptRecord("approval", "a1", "failed read validation")


def test_a_record_of_a_state_not_asked_for_is_reported() -> None:
    broken = WrongStates()
    put(broken, saga("s1", SagaState.COMPLETED))
    page = scans(broken).sagas([SagaState.RUNNING])
    assert page.records == ()
    assert page.corrupt == (CorruptRecord("saga", "s1", "scan returned a saga/completed record"),)


def test_a_record_of_another_kind_is_reported() -> None:
    broken = WrongKind()
    put(broken, saga("s1", steps=(step(XR),)))
    page = scans(broken).due_sagas(T0 + 10_000)
    assert page.records == ()
    assert page.corrupt == (CorruptRecord("saga", "s1", "scan returned a approval/running record"),)


# ------------------------------------------------------------------ what is scanned


def test_sagas_page_with_the_cursor(store: MemoryStore) -> None:
    for i in range(5):
        put(store, saga(f"s{i}", at=T0 + i))
    first = scans(store).sagas(["running"], limit=2)
    second = scans(store).sagas(["running"], cursor=first.cursor, limit=2)
    third = scans(store).sagas(["running"], cursor=second.cursor, limit=2)
    ids = [r.saga_id for p in (first, second, third) for r in p.records]
    assert ids == ["s0", "s1", "s2", "s3", "s4"] and third.cursor is None


def test_updated_before_is_passed_to_the_store(store: MemoryStore) -> None:
    put(store, saga("old", at=T0))
    put(store, saga("new", at=T0 + 10))
    page = scans(store).sagas(["running"], updated_before_ms=T0 + 10)
    assert [r.saga_id for r in page.records] == ["old"]


def test_a_definition_is_scanned_through_its_label(store: MemoryStore) -> None:
    put(store, saga("o-1", definition="place-order"))
    put(store, saga("n-1", definition="notify-user"))
    put(store, saga("o-2", SagaState.COMPLETED, definition="place-order"))
    page = scans(store).sagas(["running", "completed"], definition="place-order")
    assert [r.saga_id for r in page.records] == ["o-1", "o-2"]
    assert scans(store).sagas(["running"], definition="nobody").records == ()


def test_one_bucket_is_scanned_alone() -> None:
    store = MemoryStore(buckets=4)
    ids = [f"s{i}" for i in range(40)]
    for saga_id in ids:
        put(store, saga(saga_id))
        put(store, approval(f"a-{saga_id}"))
    for bucket in range(4):
        sagas = scans(store).sagas(["running"], bucket=bucket, limit=100).records
        approvals = scans(store).approvals(["pending"], bucket=bucket, limit=100).records
        assert sorted(r.saga_id for r in sagas) == sorted(i for i in ids if store.bucket_of(i) == bucket)
        assert {store.bucket_of(a.approval_id) for a in approvals} <= {bucket}
    assert sum(len(scans(store).sagas(["running"], bucket=b).records) for b in range(4)) == 40


def test_due_sagas_are_those_whose_due_time_passed_earliest_first(store: MemoryStore) -> None:
    # given: a released step due at T0 + 5000, a compensation retry due at T0 + 3000
    released = saga("retry", steps=(step(XR, next_attempt_at_ms=T0 + 5_000),))
    backing_off = saga("undo", SagaState.COMPENSATING, steps=(step(CF, next_attempt_at_ms=T0 + 3_000),))
    for record in (released, backing_off, saga("idle"), saga("done", SagaState.COMPLETED)):
        put(store, record)
    assert (due_at(released), due_at(backing_off)) == (T0 + 5_000, T0 + 3_000)

    # when
    early = scans(store).due_sagas(T0 + 3_000)
    later = scans(store).due_sagas(T0 + 5_001)

    # then: due strictly before the instant given
    assert early.records == ()
    assert [r.saga_id for r in later.records] == ["undo", "retry"]
    assert later.records[1] == released


def test_due_sagas_page_with_the_cursor_and_report_corrupt_records_apart(store: MemoryStore) -> None:
    for i in range(5):
        put(store, saga(f"s{i}", steps=(step(XR, next_attempt_at_ms=T0 + i),)))
    corrupt(store, "saga", "s2")
    first = scans(store).due_sagas(T0 + 100, limit=3)
    rest = scans(store).due_sagas(T0 + 100, cursor=first.cursor, limit=3)
    assert [r.saga_id for r in (*first.records, *rest.records)] == ["s0", "s1", "s3", "s4"]
    assert [c.id for c in first.corrupt] == ["s2"] and rest.cursor is None


# ------------------------------------------------------------------ refusals


def test_repeated_states_are_scanned_once(store: MemoryStore) -> None:
    put(store, saga("s1"))
    assert len(scans(store).sagas(["running", SagaState.RUNNING]).records) == 1


@pytest.mark.parametrize("states", [[], "running", ["runing"], ["pending"]], ids=repr)
def test_unknown_states_are_refused(store: MemoryStore, states: Any) -> None:
    with pytest.raises(SagaValidationError):
        scans(store).sagas(states)


def test_approval_states_are_checked_against_approvals(store: MemoryStore) -> None:
    with pytest.raises(SagaValidationError):
        scans(store).approvals(["running"])
    assert scans(store).approvals(["pending"]).records == ()


@pytest.mark.parametrize("limit", [0, 1001, -1, True])
def test_bad_limits_raise(store: MemoryStore, limit: Any) -> None:
    with pytest.raises(SagaValidationError):
        scans(store).sagas(["running"], limit=limit)
    with pytest.raises(SagaValidationError):
        scans(store).due_sagas(T0, limit=limit)


def test_a_bucket_the_store_does_not_have_is_refused(store: MemoryStore) -> None:
    with pytest.raises(SagaValidationError):
        scans(store).sagas(["running"], bucket=1)


def test_an_envelope_the_codec_wrote_is_what_scans_read_back(store: MemoryStore) -> None:
    # the scans decode with the codec they were given: what it encoded comes back equal
    record = saga("s1", steps=(step(XR),))
    put(store, record)
    assert scans(store).sagas(["running"]).records == (record,)
    envelope = store.get("saga", "s1")
    assert isinstance(envelope, Envelope) and envelope.label == "demo"


def test_sorted_by_creation_a_rewritten_saga_keeps_its_place(store: MemoryStore) -> None:
    put(store, saga("s1", at=T0))
    put(store, saga("s2", at=T0 + 5))
    stored = store.get("saga", "s1")
    assert stored is not None
    assert store.compare_and_set(replace(stored, version=2, updated_at_ms=T0 + 9), 1)
    by_creation = scans(store).sagas_by_write(["running"], newest_first=True, by="created")
    by_write = scans(store).sagas_by_write(["running"], newest_first=True)
    assert [r.saga_id for r in by_creation.records] == ["s2", "s1"]
    assert [r.saga_id for r in by_write.records] == ["s1", "s2"]


def test_a_store_whose_ordered_scan_predates_by_still_sorts_by_last_write() -> None:
    older = LastWriteOnly()
    put(older, saga("s1", at=T0))
    put(older, saga("s2", at=T0 + 5))
    page = scans(older).sagas_by_write(["running"], newest_first=True)
    assert [r.saga_id for r in page.records] == ["s2", "s1"]
    with pytest.raises(SagaValidationError, match="by creation"):
        scans(older).sagas_by_write(["running"], by="created")
