"""Saga records over a store: read, create, and every write through one loop (docs/design.md §3.10).

``SagaRepository.update(saga_id, decide)`` is how anything changes a saga: read the record
(or start from the one the caller holds), let ``decide`` return a ``Plan`` (a whole new
record to compare-and-set, or a note to append), write it, and on a lost race read again and
decide again. Each write appends to the saga's history what it changed (and the operator's
action the plan names), derived in one place (``_protocol/history.py``), so every writer
records its transitions without knowing it (docs/design.md §2.6). The repository remembers
the last version of each saga this process read or wrote, which is what lets a delivery claim
its step without reading first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from . import _values as values
from ._cas import MAX_RACES, until_written
from ._codec import Codec, carries_write, new_write_id
from ._protocol.history import DEFAULT_HISTORY_LIMIT, recorded
from ._protocol.notes import ClaimNote, apply_notes, parse_note
from ._records import SAGA, OperatorAction, SagaRecord, SagaState
from ._topology import Topology
from .errors import (
    FencedWriteRefused,
    NonDurableStoreError,
    PayloadTooLarge,
    SagaConcurrencyError,
    SagaNotFound,
    StoreError,
    StoreUnavailable,
    UndecryptableRecord,
)
from .stores.base import Envelope, Fence, Store

__all__ = ["Plan", "RecentSagas", "SagaRepository", "unanswered"]

_STORE_POLL_S = 0.5

logger = logging.getLogger("celery_sagas.execution")


@dataclass(frozen=True, slots=True)
class Plan:
    """What one decision writes (a record to compare-and-set, or a note to append) and what to
    do right before the write and after it succeeded."""

    after: SagaRecord | None = None
    note: str | None = None
    # Who did it and why (an operator's write): the history entry the write opens with.
    action: OperatorAction | None = None
    before: Callable[[], None] | None = None
    then: tuple[Callable[[SagaRecord], None], ...] = field(default=())
    # Written instead when ``after`` is over the payload limit (a callable: worked out only then).
    too_large: Plan | Callable[[], Plan] | None = None

    def fallback(self) -> Plan | None:
        """What to write instead when ``after`` is over the payload limit, if anything."""
        return self.too_large() if callable(self.too_large) else self.too_large

    def run_effects(self, written: SagaRecord) -> None:
        """Carry out what the decision calls for once it is written."""
        for effect in self.then:
            effect(written)


# Store errors that are the store's answer (a refused fence, a store refused at first use),
# never a request whose reply may have been lost.
_ANSWERS = (FencedWriteRefused, NonDurableStoreError, StoreUnavailable)


def unanswered(error: StoreError) -> bool:
    """Whether a store error may hide a write that was applied (no reply came), rather than
    being the store's answer; such a write is read back before anything is decided again."""
    return not isinstance(error, _ANSWERS)


class _Unanswered(StoreError):
    """A write the store did not answer: it may or may not have been applied."""

    plan: Plan
    error: StoreError  # what the store raised, raised again when the caller does not wait


def _applied(envelope: Envelope, plan: Plan, write_id: str) -> bool:
    """Whether ``envelope`` (read after a lost reply) holds the write of ``plan`` stamped with
    ``write_id``: its note among the record's notes, or its write id in the body."""
    if plan.note is not None:
        return plan.note in envelope.notes
    return carries_write(envelope, write_id)


class RecentSagas:
    """A small, thread-safe LRU of the saga records this process last saw (small ones only)."""

    def __init__(self, capacity: int = 512, max_body: int = 64 * 1024) -> None:
        self._lock = threading.Lock()
        self._records: OrderedDict[str, SagaRecord] = OrderedDict()
        self._capacity = capacity
        self._max_body = max_body

    def remember(self, record: SagaRecord, body_size: int) -> None:
        """Keep ``record`` as the latest known version of its saga."""
        with self._lock:
            known = self._records.get(record.saga_id)
            if known is not None and known.version > record.version:
                return
            if body_size > self._max_body:
                self._records.pop(record.saga_id, None)
                return
            self._records[record.saga_id] = record
            self._records.move_to_end(record.saga_id)
            while len(self._records) > self._capacity:
                self._records.popitem(last=False)

    def forget(self, saga_id: str) -> None:
        """Drop a saga known to have changed elsewhere."""
        with self._lock:
            self._records.pop(saga_id, None)

    def get(self, saga_id: str) -> SagaRecord | None:
        """The last version seen, which may be stale."""
        with self._lock:
            return self._records.get(saga_id)


SETTLED = frozenset({SagaState.COMPLETED, SagaState.COMPENSATED, SagaState.MANUAL_REVIEW})


class SagaRepository:
    """Reads and writes saga records; every change goes through ``update``."""

    def __init__(
        self,
        store: Store,
        codec: Codec,
        *,
        max_races: int = MAX_RACES,
        store_wait_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        on_settled: Callable[[str], None] | None = None,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
    ) -> None:
        self.store = store
        # Where records live and the fence this thread writes under (docs/design.md §4.2).
        self.topology = Topology(store)
        # Told the id of every saga this process moved into a settled state (completed,
        # compensated, manual review): an async ``wait`` elsewhere wakes on it.
        self._on_settled = on_settled
        self.codec = codec
        self.history_limit = history_limit
        self.recent = RecentSagas()
        self._max_races = max_races
        self._store_wait_s = store_wait_s
        self._sleep = sleep

    # ------------------------------------------------------------ reading

    def get(self, saga_id: str) -> SagaRecord | None:
        """The saga record, or None when absent (one read)."""
        values.saga_id(saga_id)
        envelope = self.store.get(SAGA, saga_id)
        if envelope is None:
            return None
        record = self.codec.saga(envelope, saga_id)
        self.recent.remember(record, len(envelope.body))
        return record

    def view(self, saga_id: str) -> SagaRecord | None:
        """The saga record to show, or None: payloads no configured key decrypts read as
        ``ENCRYPTED`` (docs/design.md §7), where ``get`` raises ``UndecryptableRecord``."""
        try:
            return self.get(saga_id)
        except UndecryptableRecord:
            envelope = self.store.get(SAGA, saga_id)
            return None if envelope is None else self.codec.saga(envelope, saga_id, display=True)

    def load(self, saga_id: str) -> SagaRecord:
        """The saga record; SagaNotFound when absent."""
        record = self.get(saga_id)
        if record is None:
            raise SagaNotFound(saga_id=saga_id)
        return record

    def known(self, saga_id: str) -> SagaRecord | None:
        """The last version this process read or wrote, without reading (may be stale)."""
        return self.recent.get(saga_id)

    # ------------------------------------------------------------ writing

    def create(self, record: SagaRecord) -> SagaRecord | None:
        """Insert a new saga record (its history begun): the record as stored, or None when
        the id exists."""
        record = recorded(None, record, limit=self.history_limit)
        envelope = self.codec.saga_envelope(record)
        if not self.store.create(envelope):
            return None
        self.recent.remember(record, len(envelope.body))
        self._settled(None, record)
        return record

    def note(self, saga_id: str, note: str, expected_version: int | None, *,
             take_back_unreadable: bool = False) -> SagaRecord | None:
        """Append ``note`` (at ``expected_version`` when given): the record as written, or None.

        With ``take_back_unreadable`` a note appended to a record no configured key opens is
        taken back before ``UndecryptableRecord`` is raised (``_take_back``): a claim this
        process cannot act on is never left behind."""
        envelope = self.store.annotate(SAGA, saga_id, note, expected_version=expected_version)
        if envelope is None:
            self.recent.forget(saga_id)
            return None
        known = self.recent.get(saga_id)
        if known is not None and known.version == expected_version == envelope.version - 1:
            # The note went onto the very record this process holds: apply it here rather
            # than decode the body the store sent back (the same record, without the work).
            opener = self.codec.payload_opener(saga_id)
            record = apply_notes(known, [parse_note(note)], opener, version=envelope.version)
        else:
            try:
                record = self.codec.saga(envelope, saga_id)
            except UndecryptableRecord:
                if take_back_unreadable:
                    self._take_back(envelope, note)
                raise
        self.recent.remember(record, len(envelope.body))
        return record

    def _take_back(self, envelope: Envelope, note: str) -> None:
        """Take back ``note``, a claim just appended to ``envelope``, without decoding the
        record: append its withdrawal note, which every reader applies after it (wherever the
        claim is by then, and whatever notes precede it). A store that fails is tried again
        for up to the store wait: a withdrawal appended twice is applied once."""
        claim = parse_note(note)
        assert isinstance(claim, ClaimNote)
        withdrawal, deadline = claim.withdrawn().text(), time.monotonic() + self._store_wait_s
        while True:
            try:
                appended = self.store.annotate(SAGA, envelope.id, withdrawal) is not None
                break
            except StoreError:
                if time.monotonic() > deadline:
                    appended = False
                    break
                self._sleep(_STORE_POLL_S)
        if not appended:
            logger.error("saga %s: a claim on a record this process cannot decrypt could not "
                         "be taken back (the record is gone, holds too many notes, or the "
                         "store did not answer)", envelope.id)

    def update(
        self,
        saga_id: str,
        decide: Callable[[SagaRecord], Plan | None],
        *,
        known: SagaRecord | None = None,
        fence: Fence | None = None,
        wait_for_store: bool = False,
    ) -> tuple[SagaRecord, Plan | None]:
        """Decide on the current record and write the plan; on a lost race read and decide
        again. Returns the record as written (or as read, when nothing was to be written) and
        the plan written. With ``wait_for_store`` a store outage is waited out (30 s) instead
        of raised: the outcome of a body that ran must not be lost to a blip; and a write whose
        reply was lost is read back: when the record carries it (its write id, or its note),
        it was applied and counts as written, never decided again."""
        deadline = time.monotonic() + self._store_wait_s
        written: list[tuple[SagaRecord, Plan]] = []
        read_back: list[SagaRecord] = []  # the record read to settle a lost reply

        def wait_or_raise() -> None:
            if not wait_for_store or time.monotonic() > deadline:
                raise
            self._sleep(_STORE_POLL_S)

        def read() -> SagaRecord:
            if read_back:
                return read_back.pop()
            while True:
                try:
                    return self.load(saga_id)
                except StoreError:
                    wait_or_raise()

        def write(current: SagaRecord, plan: Plan | None) -> bool:
            assert plan is not None  # None is never written
            write_id = new_write_id()
            try:
                done = self._write(current, plan, fence, write_id)
            except _Unanswered as lost:
                if not wait_for_store or time.monotonic() > deadline:
                    raise lost.error from lost.error.__cause__
                self._sleep(_STORE_POLL_S)
                envelope = self._envelope_after_outage(saga_id, wait_or_raise)
                record = self.codec.saga(envelope, saga_id)
                self.recent.remember(record, len(envelope.body))
                if _applied(envelope, lost.plan, write_id):
                    written.append((record, lost.plan))
                    return True
                read_back.append(record)
                return False
            if done is not None:
                written.append(done)
            return done is not None

        current, plan = until_written(read, decide, write, what=f"saga {saga_id!r}", first=known,
                                      budget=self._max_races)
        return (current, None) if plan is None else written[-1]

    def _envelope_after_outage(self, saga_id: str, wait_or_raise: Callable[[], None]) -> Envelope:
        """The stored envelope, read once the store answers again."""
        while True:
            try:
                envelope = self.store.get(SAGA, saga_id)
            except StoreError:
                wait_or_raise()
                continue
            if envelope is None:
                raise SagaNotFound(saga_id=saga_id)
            return envelope

    def _write(self, current: SagaRecord, plan: Plan, fence: Fence | None, write_id: str
               ) -> tuple[SagaRecord, Plan] | None:
        """One attempt at writing ``plan`` (its record stamped with ``write_id``): the record as
        written and the plan it came from (the too-large fallback when the plan's record was
        over the limit), or None when the race was lost. ``_Unanswered`` when the store did
        not answer (the write may or may not have been applied)."""
        if plan.before is not None:
            plan.before()
        if plan.note is not None:
            noted = self._unanswered(plan, lambda: self.note(current.saga_id, plan.note or "",
                                                             current.version))
            return None if noted is None else (noted, plan)
        assert plan.after is not None
        after = plan.after
        try:
            stored = self._unanswered(
                plan, lambda: self._compare_and_set(current, after, fence, write_id, plan.action))
        except PayloadTooLarge:
            fallback = plan.fallback()
            if fallback is None:
                raise
            return self._write(current, fallback, fence, write_id)
        return None if stored is None else (stored, plan)

    @staticmethod
    def _unanswered(plan: Plan, attempt: Callable[[], SagaRecord | None]) -> SagaRecord | None:
        """``attempt()``, its store errors that may be a lost reply raised as ``_Unanswered``
        naming ``plan``."""
        try:
            return attempt()
        except StoreError as exc:
            if not unanswered(exc):
                raise
            raise _Unanswered(str(exc), plan=plan, error=exc) from exc

    def _compare_and_set(self, before: SagaRecord, after: SagaRecord, fence: Fence | None,
                         write_id: str | None = None, action: OperatorAction | None = None
                         ) -> SagaRecord | None:
        after = recorded(before, after, action=action, limit=self.history_limit)
        # Stamped with a fresh write id: two racers that computed the same next record must
        # not both be told they won (a store takes an identical record for a retried write).
        envelope = self.codec.saga_envelope(after, stamp=True, write_id=write_id)
        if not self.store.compare_and_set(envelope, before.version, fence=fence):
            self.recent.forget(before.saga_id)
            return None
        self.recent.remember(after, len(envelope.body))
        self._settled(before, after)
        return after

    def _settled(self, before: SagaRecord | None, after: SagaRecord) -> None:
        if self._on_settled is not None and after.state in SETTLED and (
                before is None or before.state is not after.state):
            self._on_settled(after.saga_id)

    def write(self, before: SagaRecord, after: SagaRecord, fence: Fence | None = None) -> SagaRecord:
        """Compare-and-set ``after`` over ``before`` once; SagaConcurrencyError when it lost."""
        written = self._compare_and_set(before, after, fence)
        if written is None:
            raise SagaConcurrencyError(f"saga {before.saga_id!r} changed under us")
        return written

