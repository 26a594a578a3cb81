"""The store conformance suite: the ``Store`` contract (docs/design.md §4.1) as pytest tests.

It ships inside the package so that a third-party store is held to the same contract as the
built-in ones. Subclass the mixin in a test module whose class name starts with ``Test``; each
``test_*`` method runs against a fresh store from ``make_store``::

    # tests/test_my_store.py
    from celery_sagas.testing.conformance import StoreConformance
    from my_package import MyStore


    class TestMyStore(StoreConformance):
        def make_store(self) -> MyStore:
            return MyStore("myscheme://localhost/test", prefix=fresh_prefix())

        def destroy_store(self, store: MyStore) -> None:  # optional, default: store.close()
            store.drop_everything()
            store.close()

        def corrupt(self, store: MyStore, kind: str, record_id: str) -> None:  # optional
            store.raw_set_body(kind, record_id, "not json {")

``corrupt`` must overwrite the body of an existing record with text that is not valid JSON,
keeping its kind, id, state and version, so the invalid-record test can run; without it that
test is skipped. A subclass defining its own ``teardown_method`` must call ``super()``.

Every test names its own timestamps (no real clock), and uses fresh ids and state names, so
the suite is deterministic and may share one backend with other tests. Concurrency is proven
with ``THREADS`` real threads released together by a ``threading.Barrier``.
"""

from __future__ import annotations

import base64
import hashlib
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from .._approvals.ledger import ApprovalLedger
from .._codec import Codec
from .._records import ApprovalRecord, ApprovalState, Binding, SagaRecord, SagaState
from .._scans import Scans
from ..errors import (
    ApprovalDecisionError,
    ApprovalTokenReplay,
    FencedWriteRefused,
    InvalidRecordError,
    SagaValidationError,
)
from ..stores.base import (
    MAX_NOTES,
    CountSnapshot,
    Envelope,
    Fence,
    Lease,
    LeaseHolder,
    LeaseTakeover,
    OrderedScan,
    PrefixScan,
    StateListing,
    Store,
    delete_all,
)
from .clock import FrozenClock
from .racing import ReadTogether, race

__all__ = ["StoreConformance"]

T0 = 1_700_000_000_000
THREADS = 16
JOIN_TIMEOUT_S = 60.0
MIB = 1024 * 1024

BAD_IDS = [
    "",
    "has space",
    "new\nline",
    "tab\tbed",
    "ctrl\x01",
    "nul\x00",
    "del\x7f",
    "caf\u00e9",
    "x" * 10_000,
]
BAD_KINDS = ["", "Saga", "sa ga", "1saga", "saga-x", "k" * 40]
BAD_LIMITS: list[Any] = [0, 1001, -1, True, False, 1.5, "10", None]
_BINDING = Binding("payments.refund", "t1", "alice")


def _fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def _envelope(
    record_id: str, state: str, at_ms: int, *, kind: str = "saga", version: int = 1, body: str = ""
) -> Envelope:
    return Envelope(kind, record_id, version, state, at_ms, body or f'{{"id":"{record_id}"}}')


def _next(envelope: Envelope, **changes: Any) -> Envelope:
    """The envelope one version on, with ``changes`` applied."""
    return replace(envelope, version=envelope.version + 1, **changes)


def _page_ids(
    store: Store,
    kind: str,
    states: list[str],
    limit: int,
    updated_before_ms: int | None = None,
    *,
    label: str | None = None,
    bucket: int | None = None,
) -> list[str]:
    """Every id a paged scan returns, in order, checking page sizes and states on the way."""
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(10_000):
        page = store.scan(kind, states, label=label, updated_before_ms=updated_before_ms,
                          bucket=bucket, cursor=cursor, limit=limit)
        assert len(page.items) <= limit
        for envelope in page.items:
            assert envelope.kind == kind and envelope.state in states
            assert label is None or envelope.label == label
        seen.extend(envelope.id for envelope in page.items)
        if page.cursor is None:
            return seen
        cursor = page.cursor
    raise AssertionError("scan did not finish within 10,000 pages")


def _due_ids(store: Store, kind: str, before_ms: int, limit: int) -> list[str]:
    """Every id a paged due scan returns, in order, checking the due times on the way
    (earliest first within each bucket)."""
    seen: list[str] = []
    cursor: str | None = None
    last: dict[int, tuple[int, str]] = {}
    for _ in range(10_000):
        page = store.scan_due(kind, due_before_ms=before_ms, cursor=cursor, limit=limit)
        assert len(page.items) <= limit
        for envelope in page.items:
            assert envelope.kind == kind and envelope.due_at_ms is not None
            assert envelope.due_at_ms < before_ms
            position, bucket = (envelope.due_at_ms, envelope.id), store.bucket_of(envelope.id)
            assert bucket not in last or position > last[bucket]
            last[bucket] = position
        seen.extend(envelope.id for envelope in page.items)
        if page.cursor is None:
            return seen
        cursor = page.cursor
    raise AssertionError("scan_due did not finish within 10,000 pages")


class StoreConformance:
    """Mixin of store contract tests; subclass it as ``Test...`` and implement ``make_store``."""

    def make_store(self) -> Store:
        """Return a fresh, empty store to test (override)."""
        raise NotImplementedError("StoreConformance subclasses must implement make_store()")

    def destroy_store(self, store: Store) -> None:
        """Clean up a store after a test (override to drop keys or tables)."""
        store.close()

    def corrupt(self, store: Store, kind: str, record_id: str) -> None:
        """Overwrite an existing record's body with invalid JSON (optional hook)."""
        raise NotImplementedError

    # ------------------------------------------------------------ plumbing

    def _store(self) -> Store:
        # Racing threads of one test must share one store: it is made under a lock, which
        # dict.setdefault (atomic) hands to every thread the same.
        with self.__dict__.setdefault("_conformance_lock", threading.Lock()):
            made: Store | None = self.__dict__.get("_conformance_store")
            if made is None:
                made = self.make_store()
                self._conformance_store = made
            return made

    def teardown_method(self, method: object) -> None:
        """Destroy the store the test made, if any."""
        made: Store | None = self.__dict__.pop("_conformance_store", None)
        if made is not None:
            self.destroy_store(made)

    def _created(self, envelope: Envelope) -> Envelope:
        assert self._store().create(envelope) is True
        return envelope

    # ------------------------------------------------------------ records

    def test_store_declares_durability(self) -> None:
        assert isinstance(self._store().durable, bool)

    def test_create_then_get_returns_the_envelope(self) -> None:
        envelope = self._created(_envelope(_fresh("r"), "running", T0))
        assert self._store().get("saga", envelope.id) == envelope

    def test_duplicate_create_is_refused_and_keeps_the_first(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        second = replace(first, state="other", updated_at_ms=T0 + 5, body='{"second":true}')
        assert self._store().create(second) is False
        assert self._store().get("saga", first.id) == first

    def test_get_of_a_missing_id_is_none(self) -> None:
        assert self._store().get("saga", _fresh("missing")) is None

    def test_kinds_are_separate_namespaces(self) -> None:
        record_id = _fresh("r")
        saga = self._created(_envelope(record_id, "running", T0))
        effect = self._created(_envelope(record_id, "admission", T0 + 1, kind="effect"))
        assert self._store().get("saga", record_id) == saga
        assert self._store().get("effect", record_id) == effect

    def test_unicode_body_round_trips(self) -> None:
        body = '{"text":"caf\u00e9 \u20ac \U0001f600 \u65e5\u672c"}'
        envelope = self._created(_envelope(_fresh("r"), "running", T0, body=body))
        assert self._store().get("saga", envelope.id) == envelope

    @pytest.mark.parametrize("prefix", ["{brace", "brace}", "a{b}c", "*?[glob]", "q'\"`", "b\\s%_"],
                             ids=repr)
    def test_ids_of_any_printable_ascii_round_trip(self, prefix: str) -> None:
        # docs/design.md §2.5: ids are printable ASCII without spaces; braces, globs, quotes included
        state = _fresh("st")
        first = self._created(_envelope(_fresh(prefix), state, T0))
        assert self._store().get("saga", first.id) == first
        moved = _next(first, updated_at_ms=T0 + 1)
        assert self._store().compare_and_set(moved, 1) is True
        assert self._store().scan("saga", [state]).items == (moved,)
        assert self._store().get("saga", first.id.replace(prefix, "x", 1)) is None

    def test_a_one_mib_body_round_trips(self) -> None:
        filler = "x" * (MIB - len('{"blob":""}'))
        big = self._created(_envelope(_fresh("r"), "running", T0, body=f'{{"blob":"{filler}"}}'))
        assert len(big.body) == MIB
        assert self._store().get("saga", big.id) == big
        moved = _next(big, body=f'{{"blob":"{filler[:-1]}y"}}', updated_at_ms=T0 + 1)
        assert self._store().compare_and_set(moved, 1) is True
        assert self._store().get("saga", big.id) == moved
        assert self._store().scan("saga", ["running"], limit=1000).items.count(moved) == 1

    # ------------------------------------------------------------ compare-and-set

    def test_cas_with_the_expected_version_replaces_the_record(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        second = _next(first, state="completed", updated_at_ms=T0 + 1, body='{"n":2}')
        assert self._store().compare_and_set(second, 1) is True
        assert self._store().get("saga", first.id) == second

    def test_stale_cas_is_refused_and_changes_nothing(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        second = _next(first, updated_at_ms=T0 + 1, body='{"n":2}')
        assert self._store().compare_and_set(second, 1) is True
        stale = _next(first, updated_at_ms=T0 + 2, body='{"n":"stale"}')
        assert self._store().compare_and_set(stale, 1) is False
        assert self._store().get("saga", first.id) == second

    def test_cas_of_a_missing_record_is_refused(self) -> None:
        ghost = _envelope(_fresh("ghost"), "running", T0, version=2)
        assert self._store().compare_and_set(ghost, 1) is False
        assert self._store().get("saga", ghost.id) is None

    @pytest.mark.parametrize("new_version", [1, 3, 7])
    def test_cas_with_a_wrong_new_version_raises(self, new_version: int) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        wrong = replace(first, version=new_version, updated_at_ms=T0 + 1, body='{"n":"bad"}')
        with pytest.raises(SagaValidationError):
            self._store().compare_and_set(wrong, 1)
        assert self._store().get("saga", first.id) == first

    def test_an_already_applied_identical_cas_reports_true(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        second = _next(first, state="compensating", updated_at_ms=T0 + 1)
        assert self._store().compare_and_set(second, 1) is True
        assert self._store().compare_and_set(second, 1) is True
        assert self._store().get("saga", first.id) == second

    def test_an_already_applied_cas_with_another_body_reports_false(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        assert self._store().compare_and_set(_next(first, body='{"n":"a"}'), 1) is True
        assert self._store().compare_and_set(_next(first, body='{"n":"b"}'), 1) is False
        assert self._store().get("saga", first.id) == _next(first, body='{"n":"a"}')

    def test_concurrent_cas_writers_exactly_one_wins(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        writes = [_next(first, updated_at_ms=T0 + 1, body=f'{{"writer":{i}}}') for i in range(THREADS)]
        results = race(lambda i: self._store().compare_and_set(writes[i], 1))
        assert results.count(True) == 1 and results.count(False) == THREADS - 1, results
        assert self._store().get("saga", first.id) == writes[results.index(True)]

    def test_concurrent_creators_exactly_one_wins(self) -> None:
        record_id = _fresh("r")
        bodies = [_envelope(record_id, "running", T0, body=f'{{"creator":{i}}}') for i in range(THREADS)]
        results = race(lambda i: self._store().create(bodies[i]))
        assert results.count(True) == 1 and results.count(False) == THREADS - 1, results
        assert self._store().get("saga", record_id) == bodies[results.index(True)]

    def test_cas_moves_the_record_between_state_indexes(self) -> None:
        old, new = _fresh("old"), _fresh("new")
        first = self._created(_envelope(_fresh("r"), old, T0))
        moved = _next(first, state=new, updated_at_ms=T0 + 1)
        assert self._store().compare_and_set(moved, 1) is True
        assert self._store().scan("saga", [old]).items == ()
        assert self._store().scan("saga", [new]).items == (moved,)

    # ------------------------------------------------------------ validation

    @pytest.mark.parametrize("bad_id", BAD_IDS, ids=lambda v: repr(v[:12]))
    def test_bad_ids_are_refused(self, bad_id: str) -> None:
        state = _fresh("st")
        with pytest.raises(SagaValidationError):
            self._store().create(_envelope(bad_id, state, T0))
        with pytest.raises(SagaValidationError):
            self._store().compare_and_set(_envelope(bad_id, state, T0, version=2), 1)
        with pytest.raises(SagaValidationError):
            self._store().get("saga", bad_id)
        assert self._store().scan("saga", [state]).items == ()

    @pytest.mark.parametrize("bad_kind", BAD_KINDS)
    def test_bad_kinds_are_refused(self, bad_kind: str) -> None:
        with pytest.raises(SagaValidationError):
            self._store().create(_envelope(_fresh("r"), "running", T0, kind=bad_kind))
        with pytest.raises(SagaValidationError):
            self._store().get(bad_kind, _fresh("r"))
        with pytest.raises(SagaValidationError):
            self._store().scan(bad_kind, ["running"])

    @pytest.mark.parametrize(
        "changes",
        [
            {"version": 0},
            {"version": -1},
            {"version": True},
            {"updated_at_ms": -1},
            {"updated_at_ms": 2**53},
            {"updated_at_ms": 1.5},
            {"state": "has space"},
            {"state": ""},
            {"body": b"{}"},
            {"body": '{"lone":"\ud800"}'},
        ],
        ids=str,
    )
    def test_bad_envelope_fields_are_refused(self, changes: dict[str, Any]) -> None:
        bad = replace(_envelope(_fresh("r"), "running", T0), **changes)
        with pytest.raises(SagaValidationError):
            self._store().create(bad)
        assert self._store().get("saga", bad.id) is None

    @pytest.mark.parametrize("limit", BAD_LIMITS, ids=repr)
    def test_scan_limits_outside_1_to_1000_raise(self, limit: Any) -> None:
        with pytest.raises(SagaValidationError):
            self._store().scan("saga", ["running"], limit=limit)

    @pytest.mark.parametrize("states", [[], "running", ["has space"], ["run\n"]], ids=repr)
    def test_bad_scan_states_raise(self, states: Any) -> None:
        with pytest.raises(SagaValidationError):
            self._store().scan("saga", states)

    def test_bad_cas_arguments_are_refused(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        second = _next(first, updated_at_ms=T0 + 1)
        for expected in (True, 1.0):
            with pytest.raises(SagaValidationError):
                self._store().compare_and_set(second, expected)  # type: ignore[arg-type]
        bad_fences = (Fence("bad name", 1), Fence(_fresh("lease"), -1), Fence(_fresh("lease"), 2**53),
                      Fence(_fresh("lease"), 1, -1), Fence(_fresh("lease"), 1, self._store().buckets))
        for fence in bad_fences:
            with pytest.raises(SagaValidationError):
                self._store().compare_and_set(second, 1, fence=fence)
        assert self._store().get("saga", first.id) == first

    @pytest.mark.parametrize("cursor", [
        "!!!", "not-a-cursor", "e30",
        base64.urlsafe_b64encode(b"[" * 2500).decode(),  # nested past the JSON parser's depth
        "A" * 100_000,
    ], ids=lambda c: repr(c[:12]))
    def test_a_malformed_cursor_raises(self, cursor: str) -> None:
        self._created(_envelope(_fresh("r"), "running", T0))
        with pytest.raises(SagaValidationError):
            self._store().scan("saga", ["running"], cursor=cursor)

    @pytest.mark.parametrize("before", [-1, 2**53, 1.5, True], ids=repr)
    def test_a_bad_updated_before_raises(self, before: Any) -> None:
        with pytest.raises(SagaValidationError):
            self._store().scan("saga", ["running"], updated_before_ms=before)

    # ------------------------------------------------------------ scans

    def _scan_fixture(self) -> tuple[list[str], set[str]]:
        """Two fresh states holding 24 records (timestamps tied in threes) plus noise."""
        states = [_fresh("a"), _fresh("b")]
        expected: set[str] = set()
        for i in range(24):
            envelope = _envelope(_fresh(f"m{i}"), states[i % 2], T0 + i // 3)
            expected.add(self._created(envelope).id)
        self._created(_envelope(_fresh("other-kind"), states[0], T0, kind="effect"))
        self._created(_envelope(_fresh("other-state"), _fresh("final"), T0))
        moved = self._created(_envelope(_fresh("moved-away"), states[1], T0 + 2))
        assert self._store().compare_and_set(_next(moved, state="completed"), 1) is True
        return states, expected

    @pytest.mark.parametrize("limit", [1, 7, 1000])
    def test_scan_pages_return_every_match_exactly_once(self, limit: int) -> None:
        states, expected = self._scan_fixture()
        seen = _page_ids(self._store(), "saga", states, limit)
        assert sorted(seen) == sorted(expected)

    @pytest.mark.parametrize("limit", [1, 7, 1000])
    def test_scan_paging_is_exact_while_other_records_are_written(self, limit: int) -> None:
        states, expected = self._scan_fixture()
        stop = threading.Event()
        written: list[int] = [0]
        errors: list[BaseException] = []
        writer = threading.Thread(target=self._write_noise, args=(states, stop, written, errors), daemon=True)
        writer.start()
        try:
            self._wait_for(lambda: written[0] >= 3 or bool(errors))
            seen = _page_ids(self._store(), "saga", states, limit)
        finally:
            stop.set()
            writer.join(JOIN_TIMEOUT_S)
        assert not errors, errors
        assert sorted(seen) == sorted(expected)
        assert written[0] >= 3

    def _write_noise(
        self,
        states: list[str],
        stop: threading.Event,
        written: list[int],
        errors: list[BaseException],
    ) -> None:
        """Write records of other kinds, other states and other ids until told to stop."""
        store = self._store()
        try:
            while not stop.is_set():
                at = T0 + written[0] % 40
                store.create(_envelope(_fresh("noise"), states[0], at, kind="effect"))
                final = self._created(_envelope(_fresh("noise"), "completed", at))
                assert store.compare_and_set(_next(final, state="compensated"), 1) is True
                written[0] += 1
        except BaseException as exc:
            errors.append(exc)

    @staticmethod
    def _wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, "condition not met before the deadline"
            time.sleep(0.002)

    def test_scan_never_returns_other_states_or_kinds(self) -> None:
        wanted, other = _fresh("want"), _fresh("other")
        mine = self._created(_envelope(_fresh("r"), wanted, T0))
        self._created(_envelope(_fresh("r"), other, T0))
        self._created(_envelope(_fresh("r"), wanted, T0, kind="effect"))
        assert self._store().scan("saga", [wanted]).items == (mine,)

    def test_stored_states_lists_each_state_of_a_kind_once(self) -> None:
        store = self._store()
        if not isinstance(store, StateListing):
            pytest.skip("this store does not list its states (StateListing is optional)")
        kind = f"k{uuid.uuid4().hex[:12]}"
        states = sorted(_fresh("st") for _ in range(3))
        for state in [*states, states[0]]:
            self._created(_envelope(_fresh("r"), state, T0, kind=kind))
        moved = self._created(_envelope(_fresh("r"), _fresh("gone"), T0, kind=kind))
        assert store.compare_and_set(replace(moved, version=2, state=states[1]), 1) is True
        assert sorted(store.stored_states(kind)) == states
        assert store.stored_states(f"k{uuid.uuid4().hex[:12]}") == []

    def test_a_prefix_scan_pages_the_ids_with_the_prefix_by_id(self) -> None:
        store = self._store()
        if not isinstance(store, PrefixScan):
            pytest.skip("this store has no prefix scan (PrefixScan is optional)")
        state, other, prefix = _fresh("st"), _fresh("st"), f"p{uuid.uuid4().hex[:8]}-"
        mine = sorted(self._created(_envelope(f"{prefix}{n:02d}", state, T0 + n)).id
                      for n in range(7))
        self._created(_envelope(f"{prefix}x", other, T0))  # another state
        self._created(_envelope(f"{prefix[:-1]}_", state, T0))  # no prefix match
        self._created(_envelope(f"{prefix}k", state, T0, kind="effect"))  # another kind
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = store.scan_prefix("saga", prefix, [state], cursor=cursor, limit=3)
            assert len(page.items) <= 3
            seen += [e.id for e in page.items]
            cursor = page.cursor
            if cursor is None:
                break
        assert seen == mine
        with pytest.raises(SagaValidationError):
            store.scan_prefix("saga", prefix, [state], cursor="elsewhere")

    def test_a_prefix_scan_no_longer_finds_a_deleted_record(self) -> None:
        store = self._store()
        if not isinstance(store, PrefixScan):
            pytest.skip("this store has no prefix scan (PrefixScan is optional)")
        state, prefix = _fresh("st"), f"d{uuid.uuid4().hex[:8]}-"
        kept, gone = (self._created(_envelope(f"{prefix}{n}", state, T0)) for n in range(2))
        assert store.delete("saga", gone.id, gone.version) is True
        page = store.scan_prefix("saga", prefix, [state])
        assert [e.id for e in page.items] == [kept.id] and page.cursor is None

    def test_a_prefix_scan_finds_every_match_among_many_ids_of_every_bucket(self) -> None:
        store = self._store()
        if not isinstance(store, PrefixScan):
            pytest.skip("this store has no prefix scan (PrefixScan is optional)")
        state, prefix = _fresh("st"), f"m{uuid.uuid4().hex[:6]}"
        made = [self._created(_envelope(f"{prefix}-{n:03d}", state, T0 + n)).id
                for n in range(60)]
        wanted = sorted(i for i in made if i.startswith(f"{prefix}-01"))
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = store.scan_prefix("saga", f"{prefix}-01", [state], cursor=cursor, limit=4)
            seen += [e.id for e in page.items]
            if (cursor := page.cursor) is None:
                break
        assert seen == wanted and len(wanted) == 10

    def _ordered_ids(self, store: OrderedScan, states: list[str], *, newest_first: bool,
                     limit: int = 3, **filters: Any) -> list[str]:
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = store.scan_ordered("saga", states, newest_first=newest_first, cursor=cursor,
                                      limit=limit, **filters)
            assert len(page.items) <= limit
            seen += [e.id for e in page.items]
            if (cursor := page.cursor) is None:
                return seen

    def _ordered_store(self) -> OrderedScan:
        store = self._store()
        if not isinstance(store, OrderedScan):
            pytest.skip("this store has no ordered scan (OrderedScan is optional)")
        return store

    def _made_in_two_states(self) -> tuple[str, str, list[Envelope], list[str]]:
        """Two fresh states' 14 records, three a millisecond (ties), one more in a third
        state; and their ids by (updated_at_ms, id)."""
        first, second, other = _fresh("st"), _fresh("st"), _fresh("st")
        made = [self._created(_envelope(_fresh(f"o{n}"), (first, second)[n % 2], T0 + n // 3))
                for n in range(14)]
        self._created(_envelope(_fresh("x"), other, T0 + 1))
        return first, second, made, [e.id for e in sorted(made, key=lambda e: (e.updated_at_ms, e.id))]

    def test_an_ordered_scan_lists_several_states_by_last_write_either_way(self) -> None:
        store = self._ordered_store()
        first, second, made, order = self._made_in_two_states()
        assert self._ordered_ids(store, [first, second], newest_first=False) == order
        assert self._ordered_ids(store, [first, second], newest_first=True) == order[::-1]
        assert self._ordered_ids(store, [first, second], newest_first=True, limit=1000) == \
            order[::-1]
        before = [e.id for e in sorted(made, key=lambda e: (e.updated_at_ms, e.id))
                  if e.updated_at_ms < T0 + 2]
        assert self._ordered_ids(store, [second, first], newest_first=True,
                                 updated_before_ms=T0 + 2) == before[::-1]

    def test_an_ordered_scan_places_a_rewritten_record_at_its_new_write(self) -> None:
        store = self._ordered_store()
        state, done = _fresh("st"), _fresh("st")
        old, young = (self._created(_envelope(_fresh("r"), state, T0 + n)) for n in (0, 5))
        assert self._store().compare_and_set(_next(old, state=done, updated_at_ms=T0 + 9), 1) is True
        assert self._ordered_ids(store, [state, done], newest_first=True) == [old.id, young.id]
        assert self._ordered_ids(store, [state], newest_first=False) == [young.id]

    def test_an_ordered_scan_by_created_lists_by_creation_either_way(self) -> None:
        store = self._ordered_store()
        first, second, made, order = self._made_in_two_states()
        both = [first, second]
        assert self._ordered_ids(store, both, newest_first=False, by="created") == order
        assert self._ordered_ids(store, both, newest_first=True, by="created") == order[::-1]
        assert self._ordered_ids(store, [second, first], newest_first=True, limit=1000,
                                 by="created") == order[::-1]
        seconds = [e.id for e in made if e.state == second]
        assert self._ordered_ids(store, [second], newest_first=False, by="created") == \
            [i for i in order if i in seconds]
        early = [i for i in order if i in {e.id for e in made if e.updated_at_ms < T0 + 2}]
        assert self._ordered_ids(store, both, newest_first=True, updated_before_ms=T0 + 2,
                                 by="created") == early[::-1]

    def test_an_ordered_scan_by_created_keeps_a_rewritten_record_in_place(self) -> None:
        store = self._ordered_store()
        state, done, label = _fresh("st"), _fresh("st"), _fresh("lb")
        old, mid, young = (self._created(replace(_envelope(_fresh("r"), state, T0 + n),
                                                 label=label)) for n in (0, 5, 7))
        assert self._store().compare_and_set(_next(old, state=done, updated_at_ms=T0 + 9), 1) is True
        assert self._store().delete("saga", mid.id, 1) is True
        newest = self._ordered_ids(store, [state, done], newest_first=True, by="created")
        assert newest == [young.id, old.id]  # by last write it would be old, young
        assert self._ordered_ids(store, [state, done], newest_first=False, label=label,
                                 by="created") == [old.id, young.id]
        assert self._ordered_ids(store, [state], newest_first=False, by="created") == [young.id]
        with pytest.raises(SagaValidationError):
            store.scan_ordered("saga", [state], by="born")  # type: ignore[arg-type]
        created = store.scan_ordered("saga", [state, done], by="created", limit=1).cursor
        written = store.scan_ordered("saga", [state, done], limit=1).cursor
        assert created is not None and written is not None
        with pytest.raises(SagaValidationError):  # a cursor of one sort is refused by the other
            store.scan_ordered("saga", [state, done], cursor=created)
        with pytest.raises(SagaValidationError):
            store.scan_ordered("saga", [state, done], cursor=written, by="created")

    def test_a_count_snapshot_counts_per_state_in_all_and_per_label(self) -> None:
        store = self._store()
        if not isinstance(store, CountSnapshot):
            pytest.skip("this store counts no snapshot (CountSnapshot is optional)")
        first, second, label, other = _fresh("st"), _fresh("st"), _fresh("lb"), _fresh("lb")
        for n in range(5):
            self._created(replace(_envelope(_fresh("c"), first, T0 + n), label=label))
        self._created(replace(_envelope(_fresh("c"), first, T0), label=other))
        self._created(_envelope(_fresh("c"), second, T0))
        found = store.count_snapshot("saga", [first, second], [label])
        assert found == {(first, None): 6, (first, label): 5, (second, None): 1,
                         (second, label): 0}
        assert found[(first, None)] == store.count("saga", [first])

    def test_scan_of_a_state_without_records_is_empty(self) -> None:
        page = self._store().scan("saga", [_fresh("empty")])
        assert page.items == () and page.cursor is None

    def test_updated_before_excludes_records_updated_at_or_after_it(self) -> None:
        state = _fresh("st")
        old = [self._created(_envelope(_fresh("old"), state, T0 + i)).id for i in range(5)]
        self._created(_envelope(_fresh("at"), state, T0 + 5))
        self._created(_envelope(_fresh("new"), state, T0 + 6))
        for limit in (1, 2, 1000):
            seen = _page_ids(self._store(), "saga", [state], limit, updated_before_ms=T0 + 5)
            assert sorted(seen) == sorted(old)

    def test_a_state_named_twice_is_scanned_once(self) -> None:
        state, other = _fresh("st"), _fresh("other")
        expected = set()
        for i, in_state in enumerate([state, other] * 3):
            expected.add(self._created(_envelope(_fresh("r"), in_state, T0 + i)).id)
        for limit in (1, 2, 1000):
            seen = _page_ids(self._store(), "saga", [state, other, state, other], limit)
            assert sorted(seen) == sorted(expected)

    def test_scanned_envelopes_equal_what_get_returns(self) -> None:
        state = _fresh("st")
        first = self._created(_envelope(_fresh("r"), state, T0, body='{"deep":{"n":[1,2.5]}}'))
        moved = _next(first, updated_at_ms=T0 + 9, body='{"deep":{"n":[3]}}')
        assert self._store().compare_and_set(moved, 1) is True
        assert self._store().scan("saga", [state]).items == (moved,)

    # ------------------------------------------------------------ corrupt records

    def test_a_corrupt_record_is_reported_by_scans_not_raised(self) -> None:
        if type(self).corrupt is StoreConformance.corrupt:
            pytest.skip("this store's test class provides no corrupt() hook")
        store = self._store()
        ids = [_fresh(f"saga{i}") for i in range(3)]
        for i, saga_id in enumerate(ids):
            record = SagaRecord(saga_id, "demo", SagaState.RUNNING, {"i": i}, T0 - 1_000_000, T0 + i)
            assert store.create(Codec().saga_envelope(record)) is True
        self.corrupt(store, "saga", ids[1])
        found: set[str] = set()
        corrupt: set[str] = set()
        cursor: str | None = None
        while True:
            page = Scans(store, Codec()).sagas([SagaState.RUNNING], cursor=cursor, limit=1000)
            found.update(record.saga_id for record in page.records)
            corrupt.update(item.id for item in page.corrupt)
            if page.cursor is None:
                break
            cursor = page.cursor
        assert {ids[0], ids[2]} <= found and ids[1] not in found
        assert ids[1] in corrupt
        with pytest.raises(InvalidRecordError):
            Codec().saga(store.get("saga", ids[1]), ids[1])

    # ------------------------------------------------------------ leases

    def _acquire(self, name: str, owner: str, at_ms: int, lease_ms: int = 1000, bucket: int = 0
                 ) -> Lease | None:
        return self._store().acquire_lease(name, owner, uuid.uuid4().hex, at_ms, lease_ms,
                                           bucket=bucket)

    def _granted(self, name: str, owner: str, at_ms: int, lease_ms: int = 1000, bucket: int = 0
                 ) -> Lease:
        lease = self._acquire(name, owner, at_ms, lease_ms, bucket)
        assert lease is not None
        return lease

    def test_acquire_grants_a_lease(self) -> None:
        name = _fresh("lease")
        lease = self._store().acquire_lease(name, "alice", "tok-1", T0, 1000)
        assert lease is not None
        assert (lease.name, lease.owner, lease.token) == (name, "alice", "tok-1")
        assert lease.expires_at_ms == T0 + 1000
        assert lease.fence >= 1 and lease.cursor is None

    def test_acquire_while_held_is_refused(self) -> None:
        name = _fresh("lease")
        self._granted(name, "alice", T0)
        assert self._acquire(name, "bob", T0 + 1) is None
        assert self._acquire(name, "alice", T0 + 999) is None

    def test_concurrent_acquirers_exactly_one_wins(self) -> None:
        name = _fresh("lease")
        results = race(lambda i: self._acquire(name, f"owner{i}", T0))
        winners = [r for r in results if isinstance(r, Lease)]
        assert len(winners) == 1 and results.count(None) == THREADS - 1, results

    def test_takeover_after_expiry(self) -> None:
        name = _fresh("lease")
        old = self._granted(name, "alice", T0)
        new = self._granted(name, "bob", T0 + 1000)
        assert new.owner == "bob" and new.fence > old.fence
        assert self._store().renew_lease(old, T0 + 1001, 1000) is None
        assert self._store().checkpoint_lease(old, "stale", T0 + 1001) is False
        assert self._store().release_lease(old) is False
        assert self._acquire(name, "carol", T0 + 1001) is None

    def test_renew_extends_the_lease(self) -> None:
        name = _fresh("lease")
        lease = self._granted(name, "alice", T0)
        renewed = self._store().renew_lease(lease, T0 + 500, 1000)
        assert renewed is not None
        assert renewed.expires_at_ms == T0 + 1500
        assert (renewed.token, renewed.fence) == (lease.token, lease.fence)
        assert self._acquire(name, "bob", T0 + 1200) is None
        assert self._acquire(name, "bob", T0 + 1500) is not None

    def test_renew_with_another_token_or_owner_is_refused(self) -> None:
        name = _fresh("lease")
        lease = self._granted(name, "alice", T0)
        assert self._store().renew_lease(replace(lease, token="forged"), T0 + 1, 1000) is None
        assert self._store().renew_lease(replace(lease, owner="mallory"), T0 + 1, 1000) is None
        assert self._acquire(name, "bob", T0 + 1000) is not None

    def test_renew_after_expiry_is_refused(self) -> None:
        lease = self._granted(_fresh("lease"), "alice", T0)
        assert self._store().renew_lease(lease, T0 + 1000, 1000) is None

    def test_checkpoint_hands_the_cursor_to_the_next_holder(self) -> None:
        name = _fresh("lease")
        lease = self._granted(name, "alice", T0)
        assert self._store().checkpoint_lease(lease, "cursor-1", T0 + 10) is True
        assert self._store().release_lease(lease) is True
        assert self._granted(name, "bob", T0 + 20).cursor == "cursor-1"

    def test_the_cursor_survives_expiry(self) -> None:
        name = _fresh("lease")
        lease = self._granted(name, "alice", T0)
        assert self._store().checkpoint_lease(lease, "cursor-2", T0 + 10) is True
        assert self._granted(name, "bob", T0 + 5000).cursor == "cursor-2"

    def test_checkpoint_of_none_clears_the_cursor(self) -> None:
        name = _fresh("lease")
        lease = self._granted(name, "alice", T0)
        assert self._store().checkpoint_lease(lease, "cursor-3", T0 + 1) is True
        assert self._store().checkpoint_lease(lease, None, T0 + 2) is True
        assert self._store().release_lease(lease) is True
        assert self._granted(name, "bob", T0 + 3).cursor is None

    def test_checkpoint_by_a_non_holder_is_refused(self) -> None:
        name = _fresh("lease")
        lease = self._granted(name, "alice", T0)
        assert self._store().checkpoint_lease(lease, "kept", T0 + 1) is True
        forged = replace(lease, token="forged")
        assert self._store().checkpoint_lease(forged, "forged", T0 + 2) is False
        assert self._store().checkpoint_lease(lease, "late", T0 + 1000) is False
        assert self._granted(name, "bob", T0 + 1000).cursor == "kept"

    def test_release_frees_the_lease_once(self) -> None:
        name = _fresh("lease")
        lease = self._granted(name, "alice", T0)
        assert self._store().release_lease(lease) is True
        assert self._store().release_lease(lease) is False
        assert self._acquire(name, "bob", T0 + 1) is not None

    def test_release_by_a_non_holder_is_refused(self) -> None:
        name = _fresh("lease")
        lease = self._granted(name, "alice", T0)
        assert self._store().release_lease(replace(lease, token="forged")) is False
        assert self._store().release_lease(replace(lease, owner="mallory")) is False
        assert self._acquire(name, "bob", T0 + 1) is None

    def test_fencing_numbers_strictly_increase(self) -> None:
        name = _fresh("lease")
        fences = []
        lease = self._granted(name, "alice", T0)
        fences.append(lease.fence)
        assert self._store().release_lease(lease) is True
        fences.append(self._granted(name, "bob", T0 + 1).fence)
        fences.append(self._granted(name, "carol", T0 + 1001).fence)
        fences.append(self._granted(name, "dave", T0 + 5000).fence)
        assert fences == sorted(set(fences)), fences

    def test_leases_of_other_names_are_independent(self) -> None:
        first, second = _fresh("lease"), _fresh("lease")
        self._granted(first, "alice", T0)
        lease = self._granted(second, "bob", T0)
        assert self._store().release_lease(lease) is True

    def test_a_fenced_write_is_refused_after_a_newer_grant(self) -> None:
        name = _fresh("lease")
        record = self._created(_envelope(_fresh("r"), "running", T0))
        bucket = self._store().bucket_of(record.id)
        old = self._granted(name, "alice", T0, bucket=bucket)
        assert self._store().release_lease(old) is True
        new = self._granted(name, "bob", T0 + 1, bucket=bucket)
        with pytest.raises(FencedWriteRefused):
            self._store().compare_and_set(_next(record, body='{"by":"old"}'), 1, fence=Fence.of(old))
        assert self._store().get("saga", record.id) == record
        by_new = _next(record, body='{"by":"new"}')
        assert self._store().compare_and_set(by_new, 1, fence=Fence.of(new)) is True
        assert self._store().get("saga", record.id) == by_new

    def test_a_fenced_write_under_the_current_grant_is_accepted(self) -> None:
        record = self._created(_envelope(_fresh("r"), "running", T0))
        lease = self._granted(_fresh("lease"), "alice", T0, bucket=self._store().bucket_of(record.id))
        moved = _next(record, state="completed")
        assert self._store().compare_and_set(moved, 1, fence=Fence.of(lease)) is True

    @pytest.mark.parametrize(
        "args",
        [("bad name", "owner", "tok"), ("name", "bad owner", "tok"), ("name", "owner", "t\nk")],
        ids=repr,
    )
    def test_bad_lease_arguments_are_refused(self, args: tuple[str, str, str]) -> None:
        with pytest.raises(SagaValidationError):
            self._store().acquire_lease(*args, T0, 1000)

    @pytest.mark.parametrize(
        ("now_ms", "lease_ms"),
        [(T0, 0), (T0, -1), (T0, 1.5), (T0, True), (-1, 1000), (2**53, 1000)],
        ids=repr,
    )
    def test_bad_lease_times_are_refused(self, now_ms: Any, lease_ms: Any) -> None:
        name = _fresh("lease")
        with pytest.raises(SagaValidationError):
            self._store().acquire_lease(name, "alice", "tok", now_ms, lease_ms)
        lease = self._granted(name, "alice", T0)
        with pytest.raises(SagaValidationError):
            self._store().renew_lease(lease, now_ms, lease_ms)
        assert self._acquire(name, "bob", T0 + 999) is None

    @pytest.mark.parametrize(
        "changes", [{"name": "bad name"}, {"owner": "bad owner"}, {"token": "t\nk"}], ids=repr
    )
    def test_bad_lease_fields_are_refused_by_every_lease_call(self, changes: dict[str, Any]) -> None:
        lease = self._granted(_fresh("lease"), "alice", T0)
        bad = replace(lease, **changes)
        with pytest.raises(SagaValidationError):
            self._store().renew_lease(bad, T0 + 1, 1000)
        with pytest.raises(SagaValidationError):
            self._store().checkpoint_lease(bad, "c", T0 + 1)
        with pytest.raises(SagaValidationError):
            self._store().release_lease(bad)

    def test_a_bad_checkpoint_is_refused(self) -> None:
        lease = self._granted(_fresh("lease"), "alice", T0)
        with pytest.raises(SagaValidationError):
            self._store().checkpoint_lease(lease, 5, T0 + 1)  # type: ignore[arg-type]
        with pytest.raises(SagaValidationError):
            self._store().checkpoint_lease(lease, "c", -1)
        assert self._store().release_lease(lease) is True
        assert self._granted(lease.name, "bob", T0 + 2).cursor is None

    # ------------------------------------------------------------ lease takeover (optional)

    def _takeover(self) -> LeaseTakeover:
        store = self._store()
        if not isinstance(store, LeaseTakeover):
            pytest.skip("this store cannot take a lease over (LeaseTakeover is optional)")
        return store

    def _take_over(self, name: str, owner: str, at_ms: int, expected_fence: int,
                   lease_ms: int = 1000, bucket: int = 0) -> Lease | None:
        return self._takeover().take_over_lease(name, owner, uuid.uuid4().hex, at_ms, lease_ms,
                                                expected_fence=expected_fence, bucket=bucket)

    def test_lease_holder_names_the_holder_until_it_releases(self) -> None:
        store, name = self._takeover(), _fresh("lease")
        assert store.lease_holder(name) is None
        lease = self._granted(name, "alice", T0)
        assert store.lease_holder(name) == LeaseHolder("alice", lease.fence, T0 + 1000)
        renewed = self._store().renew_lease(lease, T0 + 10, 5000)
        assert renewed is not None
        assert store.lease_holder(name) == LeaseHolder("alice", lease.fence, T0 + 5010)
        assert self._store().release_lease(lease) is True
        assert store.lease_holder(name) is None

    def test_lease_holder_still_names_an_expired_holder(self) -> None:
        store, name = self._takeover(), _fresh("lease")
        lease = self._granted(name, "alice", T0)
        assert store.lease_holder(name) == LeaseHolder("alice", lease.fence, T0 + 1000)

    def test_a_lease_is_taken_over_before_it_expires_with_a_newer_fence_and_its_cursor(self) -> None:
        name = _fresh("lease")
        record = self._created(_envelope(_fresh("r"), "running", T0))
        bucket = self._store().bucket_of(record.id)
        old = self._granted(name, "alice", T0, lease_ms=60_000, bucket=bucket)
        assert self._store().checkpoint_lease(old, "cursor-t", T0 + 1) is True
        new = self._take_over(name, "bob", T0 + 2, old.fence, bucket=bucket)
        assert new is not None
        assert (new.owner, new.expires_at_ms, new.cursor) == ("bob", T0 + 1002, "cursor-t")
        assert new.fence > old.fence and new.bucket == bucket
        holder = self._takeover().lease_holder(name, bucket=bucket)
        assert holder == LeaseHolder("bob", new.fence, T0 + 1002)
        # the old holder, should it wake up, has lost everything
        assert self._store().renew_lease(old, T0 + 3, 60_000) is None
        assert self._store().checkpoint_lease(old, "stale", T0 + 3) is False
        assert self._store().release_lease(old) is False
        with pytest.raises(FencedWriteRefused):
            self._store().compare_and_set(_next(record), 1, fence=Fence.of(old))
        assert self._store().compare_and_set(_next(record), 1, fence=Fence.of(new)) is True
        assert self._acquire(name, "carol", T0 + 3, bucket=bucket) is None

    def test_a_takeover_naming_an_older_fence_is_refused_and_changes_nothing(self) -> None:
        name = _fresh("lease")
        first = self._granted(name, "alice", T0)
        assert self._store().release_lease(first) is True
        second = self._granted(name, "bob", T0 + 1, lease_ms=60_000)
        assert self._take_over(name, "carol", T0 + 2, first.fence) is None
        assert self._take_over(name, "carol", T0 + 2, second.fence + 1) is None
        holder = self._takeover().lease_holder(name)
        assert holder == LeaseHolder("bob", second.fence, T0 + 60_001)
        assert self._store().renew_lease(second, T0 + 3, 60_000) is not None

    def test_a_lease_never_granted_cannot_be_taken_over(self) -> None:
        name = _fresh("lease")
        assert self._take_over(name, "bob", T0, 1) is None
        assert self._takeover().lease_holder(name) is None
        assert self._granted(name, "alice", T0).fence >= 1

    def test_a_taken_over_lease_is_granted_again_after_its_new_expiry(self) -> None:
        name = _fresh("lease")
        old = self._granted(name, "alice", T0, lease_ms=60_000)
        new = self._take_over(name, "bob", T0 + 1, old.fence)
        assert new is not None
        assert self._acquire(name, "carol", T0 + 1000) is None
        later = self._granted(name, "carol", T0 + 1001)
        assert later.fence > new.fence

    def test_concurrent_takers_of_one_grant_exactly_one_wins(self) -> None:
        name = _fresh("lease")
        old = self._granted(name, "alice", T0, lease_ms=60_000)
        results = race(lambda i: self._take_over(name, f"owner{i}", T0 + 1, old.fence))
        winners = [r for r in results if isinstance(r, Lease)]
        assert len(winners) == 1 and results.count(None) == THREADS - 1, results
        holder = self._takeover().lease_holder(name)
        assert holder is not None and (holder.owner, holder.fence) == (winners[0].owner,
                                                                       winners[0].fence)

    def test_leases_of_other_buckets_are_not_taken_over(self) -> None:
        store = self._takeover()
        if self._store().buckets < 2:
            pytest.skip("this store has one bucket")
        name = _fresh("lease")
        zero = self._granted(name, "alice", T0, lease_ms=60_000, bucket=0)
        one = self._granted(name, "bob", T0, lease_ms=60_000, bucket=1)
        taken = self._take_over(name, "carol", T0 + 1, one.fence, bucket=1)
        assert taken is not None and taken.bucket == 1
        assert store.lease_holder(name, bucket=0) == LeaseHolder("alice", zero.fence, T0 + 60_000)
        assert self._store().renew_lease(zero, T0 + 2, 60_000) is not None

    @pytest.mark.parametrize("expected_fence", [0, -1, True, 1.5, "1", None, 2**53], ids=repr)
    def test_a_takeover_with_a_bad_fence_is_refused(self, expected_fence: Any) -> None:
        name = _fresh("lease")
        self._granted(name, "alice", T0)
        with pytest.raises(SagaValidationError):
            self._takeover().take_over_lease(name, "bob", "tok", T0 + 1, 1000,
                                             expected_fence=expected_fence)

    @pytest.mark.parametrize(
        "args",
        [("bad name", "owner", "tok"), ("name", "bad owner", "tok"), ("name", "owner", "t\nk"),
         ("na{me}", "owner", "tok")],
        ids=repr,
    )
    def test_bad_takeover_arguments_are_refused(self, args: tuple[str, str, str]) -> None:
        store = self._takeover()
        with pytest.raises(SagaValidationError):
            store.take_over_lease(*args, T0, 1000, expected_fence=1)
        with pytest.raises(SagaValidationError):
            store.lease_holder(args[0] if args[0] != "name" else "bad name")
        with pytest.raises(SagaValidationError):
            store.take_over_lease("name", "owner", "tok", T0, 0, expected_fence=1)
        with pytest.raises(SagaValidationError):
            store.lease_holder("name", bucket=self._store().buckets)

    # ------------------------------------------------------------ labels

    def test_a_label_scan_returns_only_that_label(self) -> None:
        state, label = _fresh("st"), _fresh("def")
        mine = [self._created(replace(_envelope(_fresh("r"), state, T0 + i), label=label)) for i in range(3)]
        self._created(replace(_envelope(_fresh("r"), state, T0), label=_fresh("other")))
        self._created(_envelope(_fresh("r"), state, T0))
        for limit in (1, 1000):
            seen = _page_ids(self._store(), "saga", [state], limit, label=label)
            assert sorted(seen) == sorted(e.id for e in mine)
        assert self._store().get("saga", mine[0].id) == mine[0]

    def test_a_labelled_record_moves_between_label_indexes_with_its_state(self) -> None:
        old, new, label = _fresh("old"), _fresh("new"), _fresh("def")
        first = self._created(replace(_envelope(_fresh("r"), old, T0), label=label))
        moved = _next(first, state=new, updated_at_ms=T0 + 1)
        assert self._store().compare_and_set(moved, 1) is True
        assert self._store().scan("saga", [old], label=label).items == ()
        assert self._store().scan("saga", [new], label=label).items == (moved,)
        assert self._store().count("saga", [new], label=label) == 1

    def test_a_cas_carrying_another_label_is_refused(self) -> None:
        label = _fresh("def")
        first = self._created(replace(_envelope(_fresh("r"), "running", T0), label=label))
        assert self._store().compare_and_set(_next(first, label=_fresh("other")), 1) is False
        assert self._store().compare_and_set(_next(first, label=None), 1) is False
        assert self._store().get("saga", first.id) == first

    # ------------------------------------------------------------ due index

    def test_scan_due_returns_records_due_before_a_time_earliest_first(self) -> None:
        kind = "due" + uuid.uuid4().hex[:8]
        due = [self._created(replace(_envelope(_fresh("r"), "running", T0, kind=kind), due_at_ms=T0 + 10 - i))
               for i in range(5)]
        self._created(replace(_envelope(_fresh("late"), "running", T0, kind=kind), due_at_ms=T0 + 100))
        self._created(_envelope(_fresh("never"), "running", T0, kind=kind))
        for limit in (1, 2, 1000):
            seen = _due_ids(self._store(), kind, T0 + 11, limit)
            assert sorted(seen) == sorted(e.id for e in due)
            if self._store().buckets == 1:
                assert seen == [e.id for e in reversed(due)]
        assert _due_ids(self._store(), kind, T0 + 7, 1000) == [due[4].id]

    def test_a_cas_moves_or_clears_the_due_time(self) -> None:
        kind = "due" + uuid.uuid4().hex[:8]
        first = self._created(replace(_envelope(_fresh("r"), "running", T0, kind=kind), due_at_ms=T0 + 50))
        later = _next(first, due_at_ms=T0 + 500)
        assert self._store().compare_and_set(later, 1) is True
        assert _due_ids(self._store(), kind, T0 + 51, 1000) == []
        assert _due_ids(self._store(), kind, T0 + 501, 1000) == [first.id]
        cleared = _next(later, due_at_ms=None)
        assert self._store().compare_and_set(cleared, 2) is True
        assert _due_ids(self._store(), kind, 2**53 - 1, 1000) == []
        assert self._store().get(kind, first.id) == cleared

    @pytest.mark.parametrize("due", [-1, 2**53, 1.5, True], ids=repr)
    def test_a_bad_due_time_is_refused(self, due: Any) -> None:
        with pytest.raises(SagaValidationError):
            self._store().create(replace(_envelope(_fresh("r"), "running", T0), due_at_ms=due))
        with pytest.raises(SagaValidationError):
            self._store().scan_due("saga", due_before_ms=due)

    # ------------------------------------------------------------ notes

    def test_annotate_appends_a_note_bumps_the_version_and_returns_the_record(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        noted = self._store().annotate("saga", first.id, '{"n":1}', expected_version=1)
        assert noted == replace(first, version=2, notes=('{"n":1}',))
        again = self._store().annotate("saga", first.id, '{"n":2}')
        assert again is not None and again.notes == ('{"n":1}', '{"n":2}') and again.version == 3
        assert self._store().get("saga", first.id) == again
        assert self._store().scan("saga", ["running"], updated_before_ms=T0 + 1).items.count(again) == 1

    def test_annotate_at_another_version_or_of_a_missing_record_writes_nothing(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        assert self._store().annotate("saga", first.id, "x", expected_version=2) is None
        assert self._store().annotate("saga", _fresh("ghost"), "x") is None
        assert self._store().get("saga", first.id) == first

    def test_a_cas_absorbs_the_notes(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        noted = self._store().annotate("saga", first.id, "claim")
        assert noted is not None
        assert self._store().compare_and_set(_next(first, body='{"n":"stale"}'), 1) is False
        absorbed = replace(_next(noted, body='{"claimed":true}'), notes=())
        assert self._store().compare_and_set(absorbed, 2) is True
        assert self._store().get("saga", first.id) == absorbed

    def test_concurrent_annotators_at_one_version_exactly_one_wins(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        results = race(lambda i: self._store().annotate(
            "saga", first.id, f"claim-{i}", expected_version=1))
        won = [r for r in results if isinstance(r, Envelope)]
        assert len(won) == 1 and results.count(None) == THREADS - 1, results
        assert self._store().get("saga", first.id) == won[0]

    def test_concurrent_annotators_without_a_version_all_land_once(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        results = race(lambda i: self._store().annotate("saga", first.id, f"s-{i}"))
        assert all(isinstance(r, Envelope) for r in results), results
        stored = self._store().get("saga", first.id)
        assert stored is not None and stored.version == 1 + THREADS
        assert sorted(stored.notes) == sorted(f"s-{i}" for i in range(THREADS))
        assert sorted(r.version for r in results if isinstance(r, Envelope)) == list(range(2, 2 + THREADS))

    def test_a_record_holds_at_most_max_notes(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        for i in range(MAX_NOTES):
            assert self._store().annotate("saga", first.id, str(i)) is not None
        assert self._store().annotate("saga", first.id, "one too many") is None
        stored = self._store().get("saga", first.id)
        assert stored is not None and len(stored.notes) == MAX_NOTES

    @pytest.mark.parametrize("note", ["", "two\nlines", 5, "lone \ud800"], ids=repr)
    def test_bad_notes_are_refused(self, note: Any) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        with pytest.raises(SagaValidationError):
            self._store().annotate("saga", first.id, note)
        with pytest.raises(SagaValidationError):
            self._store().create(replace(_envelope(_fresh("r"), "running", T0), notes=("x",)))
        assert self._store().get("saga", first.id) == first

    # ------------------------------------------------------------ delete and count

    def test_delete_removes_the_record_and_every_index_entry(self) -> None:
        state, label, kind = _fresh("st"), _fresh("def"), "del" + uuid.uuid4().hex[:8]
        first = self._created(replace(_envelope(_fresh("r"), state, T0, kind=kind), label=label,
                                      due_at_ms=T0 + 1))
        kept = self._created(_envelope(_fresh("r"), state, T0, kind=kind))
        assert self._store().delete(kind, first.id, 1) is True
        assert self._store().get(kind, first.id) is None
        assert self._store().scan(kind, [state]).items == (kept,)
        assert self._store().scan(kind, [state], label=label).items == ()
        assert _due_ids(self._store(), kind, T0 + 100, 1000) == []
        assert self._store().count(kind, [state]) == 1
        assert self._store().create(first) is True  # the id is free again

    def test_delete_at_another_version_or_of_a_missing_record_is_refused(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))
        assert self._store().delete("saga", first.id, 2) is False
        assert self._store().delete("saga", _fresh("ghost"), 1) is False
        assert self._store().get("saga", first.id) == first

    def test_a_delete_racing_writers_exactly_one_wins(self) -> None:
        first = self._created(_envelope(_fresh("r"), "running", T0))

        def attempt(i: int) -> object:
            if i == 0:
                return self._store().delete("saga", first.id, 1)
            return self._store().compare_and_set(_next(first, body=f'{{"w":{i}}}'), 1)

        results = race(attempt)
        assert results.count(True) == 1, results
        stored = self._store().get("saga", first.id)
        assert (stored is None) == (results[0] is True)

    def _retention_sweep(self, kind: str, final: list[str], before_ms: int,
                         fence: Fence | None = None) -> list[str]:
        """What a retention pass does (docs/design.md §7): scan the final states' indexes for
        records updated before ``before_ms``, delete each at the version read; the ids deleted."""
        store, deleted, cursor = self._store(), [], None
        for _ in range(10_000):
            page = store.scan(kind, final, updated_before_ms=before_ms, cursor=cursor, limit=7)
            for envelope in page.items:
                assert envelope.state in final and envelope.updated_at_ms < before_ms
            items = [(kind, e.id, e.version) for e in page.items]
            done = delete_all(store, items, fence=fence)
            deleted += [record_id for (_, record_id, _), ok in zip(items, done, strict=True) if ok]
            cursor = page.cursor
            if cursor is None:
                return deleted
        raise AssertionError("the retention scan never ended")

    def test_retention_deletes_only_final_records_past_the_cut_off_and_touches_nothing_else(
        self,
    ) -> None:
        kind, label, cut = "ret" + uuid.uuid4().hex[:8], _fresh("def"), T0 + 1000
        due = [self._created(replace(_envelope(_fresh("r"), state, T0 + i, kind=kind),
                                     label=label if i % 2 else None))
               for i, state in enumerate(["completed", "compensated"] * 10)]
        kept = [
            self._created(replace(_envelope(_fresh("r"), state, at, kind=kind), label=label,
                                  due_at_ms=at + 5 if state == "running" else None))
            for state, at in [("running", T0), ("compensating", T0), ("manual-review", T0),
                              ("completed", cut), ("compensated", cut + 1)]
        ]
        other_kind = self._created(_envelope(_fresh("r"), "completed", T0))

        deleted = self._retention_sweep(kind, ["completed", "compensated"], cut)

        store = self._store()
        assert sorted(deleted) == sorted(e.id for e in due)
        assert all(store.get(kind, e.id) is None for e in due)
        assert [store.get(kind, e.id) for e in kept] == kept
        assert store.get("saga", other_kind.id) == other_kind
        assert store.count(kind, ["completed", "compensated"]) == 2
        assert store.count(kind, ["completed", "compensated"], label=label) == 2
        assert sorted(_page_ids(store, kind, ["completed", "compensated", "running",
                                              "compensating", "manual-review"], 3)) == \
            sorted(e.id for e in kept)
        assert _due_ids(store, kind, T0 + 100, 10) == [kept[0].id]
        assert self._retention_sweep(kind, ["completed", "compensated"], cut) == []

    def test_a_batch_delete_deletes_each_record_at_its_version_as_delete_would(self) -> None:
        kind = "ret" + uuid.uuid4().hex[:8]
        first, second, third = (self._created(_envelope(_fresh("r"), "completed", T0, kind=kind))
                                for _ in range(3))
        other = self._created(_envelope(_fresh("r"), "completed", T0))
        store = self._store()
        items = [(kind, first.id, 1), (kind, second.id, 2), (kind, _fresh("ghost"), 1),
                 ("saga", other.id, 1), (kind, third.id, 1), (kind, first.id, 1)]
        assert delete_all(store, items) == [True, False, False, True, True, False]
        assert store.get(kind, second.id) == second
        assert [store.get(kind, first.id), store.get(kind, third.id), store.get("saga", other.id)] \
            == [None, None, None]
        assert delete_all(store, []) == []
        with pytest.raises(SagaValidationError):
            delete_all(store, [(kind, second.id, 2), (kind, "has space", 1)])
        assert store.get(kind, second.id) == second

    def test_a_batch_delete_under_a_stale_fence_is_refused_and_deletes_nothing(self) -> None:
        store = self._store()
        record = self._created(_envelope(_fresh("r"), "completed", T0))
        bucket, name = store.bucket_of(record.id), _fresh("lease")
        old = store.acquire_lease(name, "alice", "tok-a", T0, 1000, bucket=bucket)
        assert old is not None and store.release_lease(old)
        assert store.acquire_lease(name, "bob", "tok-b", T0 + 1, 1000, bucket=bucket) is not None
        with pytest.raises(FencedWriteRefused):
            delete_all(store, [("saga", record.id, 1)], fence=Fence.of(old))
        assert store.get("saga", record.id) == record

    def test_retention_racing_writers_deletes_a_record_or_keeps_the_write_never_both(
        self,
    ) -> None:
        kind, cut = "ret" + uuid.uuid4().hex[:8], T0 + 1000
        due = [self._created(_envelope(_fresh("r"), "completed", T0 + i, kind=kind))
               for i in range(THREADS * 2)]
        store = self._store()

        def attempt(i: int) -> object:
            if i == 0:
                return self._retention_sweep(kind, ["completed"], cut)
            # each writer changes two records as the sweep walks them: odd ones append a note
            # (still final), even ones move the record out of the final state
            wrote = []
            for envelope in due[2 * i - 2: 2 * i]:
                if i % 2:
                    wrote.append(store.annotate(kind, envelope.id, f"n-{i}") is not None)
                else:
                    wrote.append(store.compare_and_set(_next(envelope, state="running"), 1))
            return wrote

        results = race(attempt, THREADS)
        deleted = results[0]
        assert isinstance(deleted, list), results
        for i, wrote in enumerate(results[1:], start=1):
            assert isinstance(wrote, list), results
            for envelope, ok in zip(due[2 * i - 2: 2 * i], wrote, strict=True):
                stored = store.get(kind, envelope.id)
                if i % 2 == 0:
                    # moved out of the final state, or deleted while still final: never both
                    assert ok != (envelope.id in deleted), (envelope.id, ok)
                    assert (stored is None) == (not ok)
                    assert stored is None or (stored.state, stored.version) == ("running", 2)
                else:
                    # a note keeps it final: deleted at whichever version the sweep read
                    assert (stored is None) == (envelope.id in deleted)
                    assert stored is None or (ok and stored.version == 2)
        assert len(set(deleted)) == len(deleted)
        survivors = {e.id for e in due if e.id not in deleted}
        running = {i for i in survivors if store.get(kind, i).state == "running"}  # type: ignore[union-attr]
        assert store.count(kind, ["completed"]) == len(survivors - running)
        assert store.count(kind, ["running"]) == len(running)
        assert sorted(_page_ids(store, kind, ["completed", "running"], 5)) == sorted(survivors)

    def test_count_follows_states_labels_and_times(self) -> None:
        kind, label = "cnt" + uuid.uuid4().hex[:8], _fresh("def")
        for i in range(6):
            envelope = _envelope(_fresh("r"), "running" if i % 2 else "completed", T0 + i, kind=kind)
            self._created(replace(envelope, label=label if i < 4 else None))
        store = self._store()
        assert store.count(kind, ["running"]) == 3
        assert store.count(kind, ["running", "completed", "running"]) == 6
        assert store.count(kind, ["completed"], label=label) == 2
        assert store.count(kind, ["running", "completed"], updated_after_ms=T0 + 2) == 4
        assert store.count(kind, ["running", "completed"], updated_before_ms=T0 + 2) == 2
        assert store.count(kind, ["running"], updated_after_ms=T0 + 1, updated_before_ms=T0 + 4) == 2
        assert store.count(kind, [_fresh("none")]) == 0

    # ------------------------------------------------------------ buckets

    def test_buckets_split_records_by_a_stable_function_of_the_id(self) -> None:
        store = self._store()
        assert isinstance(store.buckets, int) and store.buckets >= 1
        ids = [_fresh("r") for _ in range(40)]
        buckets = [store.bucket_of(i) for i in ids]
        assert all(0 <= b < store.buckets for b in buckets)
        assert buckets == [store.bucket_of(i) for i in ids]
        state = _fresh("st")
        for record_id in ids:
            self._created(_envelope(record_id, state, T0))
        for bucket in range(store.buckets):
            seen = _page_ids(store, "saga", [state], 7, bucket=bucket)
            assert sorted(seen) == sorted(i for i, b in zip(ids, buckets, strict=True) if b == bucket)
        with pytest.raises(SagaValidationError):
            store.scan("saga", [state], bucket=store.buckets)

    def test_leases_of_two_buckets_are_independent_and_fence_their_own_bucket(self) -> None:
        store = self._store()
        if store.buckets < 2:
            pytest.skip("this store has one bucket")
        record = self._created(_envelope(_fresh("r"), "running", T0))
        home = store.bucket_of(record.id)
        other = (home + 1) % store.buckets
        name = _fresh("lease")
        here = store.acquire_lease(name, "alice", "tok-a", T0, 1000, bucket=home)
        there = store.acquire_lease(name, "bob", "tok-b", T0, 1000, bucket=other)
        assert here is not None and there is not None and (here.bucket, there.bucket) == (home, other)
        with pytest.raises(SagaValidationError):
            store.compare_and_set(_next(record), 1, fence=Fence.of(there))
        assert store.compare_and_set(_next(record), 1, fence=Fence.of(here)) is True
        assert store.release_lease(here) is True
        newer = store.acquire_lease(name, "carol", "tok-c", T0 + 1, 1000, bucket=home)
        assert newer is not None and newer.fence > here.fence
        with pytest.raises(FencedWriteRefused):
            store.compare_and_set(_next(_next(record)), 2, fence=Fence.of(here))
        with pytest.raises(FencedWriteRefused):
            store.delete("saga", record.id, 2, fence=Fence.of(here))
        assert store.get("saga", record.id) == _next(record)

    # ------------------------------------------------------------ approvals over the store

    def _approval(self, clock: FrozenClock) -> tuple[str, str]:
        approval_id, token_hash = _fresh("appr"), hashlib.sha256(b"resume-token").hexdigest()
        ApprovalLedger(self._store(), clock).create(
            approval_id=approval_id, effect_id=_fresh("eff"), binding=_BINDING,
            token_hash=token_hash, ttl_ms=60_000,
        )
        return approval_id, token_hash

    def test_concurrent_consumers_of_one_approval_exactly_one_consumes(self) -> None:
        clock = FrozenClock(T0)
        approval_id, token_hash = self._approval(clock)
        ApprovalLedger(self._store(), clock).decide(approval_id, tenant_id="t1", decision="approved",
                                                    decided_by="bob")
        racing = ApprovalLedger(ReadTogether(self._store(), THREADS), clock)

        def attempt(_: int) -> Any:
            return racing.consume(approval_id, token_hash=token_hash, binding=_BINDING)

        results = race(attempt)
        consumed = [r for r in results if isinstance(r, ApprovalRecord)]
        replays = [r for r in results if isinstance(r, ApprovalTokenReplay)]
        assert len(consumed) == 1 and len(replays) == THREADS - 1, results
        assert consumed[0].state is ApprovalState.CONSUMED

    def test_concurrent_deciders_exactly_one_decides(self) -> None:
        clock = FrozenClock(T0)
        approval_id, _ = self._approval(clock)
        choices = ["approved" if i % 2 else "denied" for i in range(THREADS)]
        racing = ApprovalLedger(ReadTogether(self._store(), THREADS), clock)

        def attempt(i: int) -> Any:
            return racing.decide(approval_id, tenant_id="t1", decision=choices[i],
                                 decided_by=f"op{i}")

        results = race(attempt)
        winners = [(i, r) for i, r in enumerate(results) if isinstance(r, ApprovalRecord)]
        losers = [r for r in results if isinstance(r, ApprovalDecisionError)]
        assert len(winners) == 1 and len(losers) == THREADS - 1, results
        i, winner = winners[0]
        assert (winner.state, winner.decided_by) == (choices[i], f"op{i}")
