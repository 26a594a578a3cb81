"""All data access of the web UI: one adapter, ``SagaSource``, over the ``Sagas`` facade.

Nothing else in ``celery_sagas.web`` reads the store or calls the facade. Every figure and
list costs what it shows, never the number of sagas kept (docs/design.md §4.1):

- the overview's numbers are store counts from the indexes: per state (``sagas.counts()``),
  per state and definition (``count(..., label=definition)``), completions and compensations
  per minute (``count(..., updated_after_ms=, updated_before_ms=)``; the count of a minute
  long past is kept, since a final saga is never written again); sagas needing an operator
  (manual review, plus the open sagas not updated for ``stale_after`` that the findings judge
  stale, not those waiting by design: ``_attention``) and pending approvals whose gate still
  waits;
- the sagas list is one page of ``sagas.browse(states, definition=..., order=...)``: the
  store filters by state and definition; sorted by last write or by creation (``order``,
  one of ``ORDERS``), one page of the store's ordered scan (``OrderedScan``: its indexes
  merged). An id prefix is one page
  of the store's prefix scan
  (``PrefixScan``: every built-in store; Redis from its id index); with a store without it the
  prefix is filtered here, on the envelopes of the store's scan (only matches are decoded), at
  most ``PREFIX_READ`` per request, with a cursor to go on from there; so is an error code;
- one saga is one ``sagas.get``; the queue is one page of ``sagas.findings("sagas")``.

Where the facade has no call, this module uses the store and two internal modules (named in
``docs/operations.md``, "The web UI"): the record kinds (``_records``) for counts, the codec
(``_codec``) to decode the sagas an id prefix picked from a scan, and ``_scans`` for a page of
pending approvals.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

import celery_sagas
from celery_sagas import (
    ApprovalRecord,
    ApprovalState,
    CorruptRecord,
    Envelope,
    Finding,
    FindingKind,
    RecordPage,
    SagaRecord,
    SagaState,
)
from celery_sagas.errors import (
    InvalidRecordError,
    SagaConfigurationError,
    SagaNotFound,
    SagaValidationError,
)

from .. import _values as values
from .._codec import Codec
from .._protocol.kinds import awaiting_decision
from .._records import APPROVAL, SAGA
from .._scans import Scans
from ..stores.base import CountSnapshot, PrefixScan
from ._attention import STALE_READ, Attention, WaitingRow, judge_stale, live_gate, waiting_rows
from ._events import Announce, OperatorAction

if TYPE_CHECKING:
    from celery_sagas import Sagas

    from ._auth import Principal

__all__ = [
    "MINUTE_MS",
    "ORDERS",
    "PREFIX_READ",
    "STATES",
    "DefinitionRow",
    "Finishes",
    "Overview",
    "SagaFilter",
    "SagaPage",
    "SagaSource",
]

MINUTE_MS = 60_000
PREFIX_READ = 1000  # records one request reads to filter by id prefix
SETTLED_AFTER_MS = 2 * 60_000  # a minute this far past keeps its count of finished sagas
ENCRYPTED_TEXT = "<encrypted>"
# Open states first: they are what an operator looks at.
STATES = (SagaState.MANUAL_REVIEW, SagaState.RUNNING, SagaState.COMPENSATING,
          SagaState.COMPLETED, SagaState.COMPENSATED)
_OPEN = [str(SagaState.RUNNING), str(SagaState.COMPENSATING)]
_FINAL = (SagaState.COMPLETED, SagaState.COMPENSATED)
_KINDS = frozenset(str(k) for k in FindingKind)
_QUEUE_PAGES = 8  # pages of the findings walk one filtered queue page reads at most
_CURSOR_VERSION = 2
_MAX_CURSOR = 4096
_MAX_BROWSE = 1000
# The sagas list's sorts, across states (``OrderedScan``): by last write or by creation; the
# keys are ``sagas.browse``'s orders.
ORDERS = {"newest": "last written, newest first", "oldest": "last written, oldest first",
          "newest-created": "created, newest first", "oldest-created": "created, oldest first"}
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Finishes:
    """Completions and compensations per minute, oldest minute first."""

    start_ms: int
    completed: tuple[int, ...]
    compensated: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DefinitionRow:
    """How many sagas of one definition are in each state (``name`` None: the others)."""

    name: str | None
    counts: dict[str, int]

    @property
    def total(self) -> int:
        """Sagas of this definition in every state."""
        return sum(self.counts.values())


@dataclass(frozen=True, slots=True)
class Overview:
    """What the overview shows; every number an exact count from the store's indexes."""

    by_state: dict[str, int]
    definitions: tuple[DefinitionRow, ...]
    finishes: Finishes
    attention: Attention
    approvals: int

    @property
    def total(self) -> int:
        """Sagas kept, in every state."""
        return sum(self.by_state.values())


@dataclass(frozen=True, slots=True)
class SagaFilter:
    """The sagas list's filter: states (empty: all), a definition, an id prefix, an error code
    (the saga's or a step's) and a time (last written before it)."""

    states: tuple[str, ...] = ()
    definition: str | None = None
    id_prefix: str | None = None
    error_code: str | None = None
    updated_before_ms: int | None = None
    order: str | None = None

    @classmethod
    def of(cls, states: Sequence[str], definition: str | None, id_prefix: str | None,
           error_code: str | None = None, updated_before: str | None = None,
           order: str | None = None) -> SagaFilter:
        """A validated filter (SagaValidationError names what is wrong); ``updated_before`` is
        an ISO 8601 date and time, UTC unless it names its offset; ``order`` is one of
        ``ORDERS`` (None: the index order, state by state)."""
        known = {str(s) for s in SagaState}
        for state in states:
            if state not in known:
                raise SagaValidationError(f"unknown saga state {state!r}")
        definition = values.definition_name(definition) if definition else None
        if id_prefix:
            values.token(id_prefix, field="id prefix", max_len=128)
        if error_code:
            values.token(error_code, field="error code", max_len=64)
        if order and order not in ORDERS:
            raise SagaValidationError(f"unknown sort {order[:20]!r}: one of {', '.join(ORDERS)}")
        return cls(tuple(dict.fromkeys(states)), definition, id_prefix or None,
                   error_code or None, _instant(updated_before) if updated_before else None,
                   order or None)

    @property
    def browsed_states(self) -> list[str]:
        """The states the list walks, open ones first."""
        return list(self.states) or [str(s) for s in STATES]

    @property
    def read_here(self) -> bool:
        """True when records are filtered here (id prefix, error code), not by an index."""
        return self.id_prefix is not None or self.error_code is not None

    def fingerprint(self) -> str:
        """A short digest that ties a cursor to this filter."""
        text = json.dumps([self.states, self.definition, self.id_prefix, self.error_code,
                           self.updated_before_ms, self.order])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _instant(text: str) -> int:
    """Epoch milliseconds of an ISO 8601 date and time (UTC when it names no offset)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise SagaValidationError("updated before is not an ISO 8601 date and time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class SagaPage:
    """One page of the sagas list and the cursor of the next (None at the end).

    ``read`` is how many records the request read; ``read_spent`` is True when an id-prefix
    filter stopped at ``PREFIX_READ`` before the page was full. ``matching`` counts every saga
    of the states and definition chosen (None with an id prefix: no index counts those).
    """

    records: tuple[SagaRecord, ...]
    corrupt: tuple[CorruptRecord, ...]
    cursor: str | None
    read: int
    read_spent: bool = False
    exact: SagaRecord | None = None
    matching: int | None = None


@dataclass(frozen=True, slots=True)
class ApprovalView:
    """An approval as the UI shows it: never its token or token hash."""

    approval_id: str
    state: str
    saga_id: str | None
    step: str | None
    tenant_id: str
    principal_id: str
    capability: str
    target: str | None
    expires_at_ms: int
    decided_by: str | None

    @classmethod
    def of(cls, record: ApprovalRecord) -> ApprovalView:
        """The view of a stored approval."""
        return cls(record.approval_id, str(record.state), record.saga_id, record.step,
                   record.tenant_id, record.principal_id, record.capability, record.target,
                   record.expires_at_ms, record.decided_by)


@dataclass(frozen=True, slots=True)
class ApprovalPage:
    """Pending approvals, corrupt ones apart, and the cursor of the next page."""

    approvals: tuple[ApprovalView, ...]
    corrupt: tuple[CorruptRecord, ...]
    cursor: str | None


@dataclass(frozen=True, slots=True)
class FindingRows:
    """One page of the findings queue and the cursor of the next."""

    findings: tuple[Finding, ...]
    cursor: str | None


class SagaSource:
    """Reads and acts for the web UI through the facade; every list is one page."""

    def __init__(self, sagas: Sagas, announce: Announce) -> None:
        self._sagas = sagas
        self.announce = announce
        self._settled: dict[tuple[str, int], int] = {}
        self._settled_lock = threading.Lock()  # requests are served by several threads

    @property
    def _codec(self) -> Codec:
        """The codec of this process's engine (it holds the encryption keys, if any)."""
        return self._sagas.codec

    def now_ms(self) -> int:
        """The facade's clock, in epoch milliseconds."""
        return self._sagas.engine.now()

    def definitions(self) -> list[str]:
        """The saga definitions this process knows, sorted."""
        return sorted(self._sagas.registry.definitions)

    @property
    def can_signal(self) -> bool:
        """True when the facade can send signals to sagas (docs/design.md §3.5)."""
        return callable(getattr(self._sagas, "signal", None))

    # ------------------------------------------------------------ overview

    def overview(self, minutes: int = 60) -> Overview:
        """Counts by state and by definition, finishes per minute, what waits for an operator.

        The counts by state and definition come from one snapshot where the store has one
        (``CountSnapshot``: every built-in store); else they are read one after another while
        sagas move. Either way they are made to agree: a state's total is the sum of its
        definitions' rows plus the others (never below zero), and manual review in the
        attention figure is that same total."""
        now = self.now_ms()
        raw, rows = self._state_counts()
        others = {state: max(0, raw[state] - sum(r.counts[state] for r in rows)) for state in raw}
        if any(others.values()):
            rows.append(DefinitionRow(None, others))
        by_state = {state: sum(r.counts[state] for r in rows) for state in raw}
        stale_before = max(0, now - self._sagas.settings.timing.stale_ms)
        review = by_state[str(SagaState.MANUAL_REVIEW)]
        past = self._sagas.store.count(SAGA, _OPEN, updated_before_ms=stale_before)
        attention = judge_stale(self._scans, stale_before, review) if past else Attention(review, 0)
        return Overview(by_state, tuple(rows), self._finishes(now, minutes), attention,
                        self._live_approvals())

    @property
    def _scans(self) -> Scans:
        return Scans(self._sagas.store, self._codec, display=True)

    def _live_approvals(self) -> int:
        """Pending approvals whose gate still waits: read (up to ``STALE_READ``) and checked
        when there are few enough, else the index's count of pending ones."""
        pending = self._sagas.store.count(APPROVAL, [str(ApprovalState.PENDING)])
        if pending == 0 or pending > STALE_READ:
            return pending
        page = self._scans.approvals([ApprovalState.PENDING], limit=max(1, pending))
        return sum(1 for r in page.records if live_gate(r, self.saga)) + len(page.corrupt)

    def stale_before_ms(self) -> int:
        """Open sagas updated before this instant are past ``stale_after``."""
        return max(0, self.now_ms() - self._sagas.settings.timing.stale_ms)

    def waiting(self, limit: int = 25) -> list[WaitingRow]:
        """Open sagas past ``stale_after`` that wait by design, with what for and until when."""
        return waiting_rows(self._scans, self.stale_before_ms(), limit)

    def _state_counts(self) -> tuple[dict[str, int], list[DefinitionRow]]:
        """Per state, every saga; per known definition, its row (one snapshot if the store
        can count one)."""
        store, names = self._sagas.store, self.definitions()
        if not isinstance(store, CountSnapshot):
            raw = self._sagas.counts()
            return raw, [DefinitionRow(name, self._by_definition(name, raw)) for name in names]
        states = [str(s) for s in SagaState]
        found = store.count_snapshot(SAGA, states, names)
        return ({state: found[(state, None)] for state in states},
                [DefinitionRow(name, {state: found[(state, name)] for state in states})
                 for name in names])

    def _by_definition(self, name: str, by_state: dict[str, int]) -> dict[str, int]:
        """Per state, the sagas of one definition (a state empty overall is not counted)."""
        store = self._sagas.store
        return {state: store.count(SAGA, [state], label=name) if total else 0
                for state, total in by_state.items()}

    def _finishes(self, now: int, minutes: int) -> Finishes:
        start = (now // MINUTE_MS - minutes + 1) * MINUTE_MS
        settled_before = now - SETTLED_AFTER_MS
        series = []
        for state in map(str, _FINAL):
            # A state with nothing in the whole window needs no per-minute counts.
            if self._count(state, start, start + minutes * MINUTE_MS) == 0:
                series.append((0,) * minutes)
                continue
            series.append(tuple(self._minute(state, start + m * MINUTE_MS, settled_before)
                                for m in range(minutes)))
        self._forget_before(start)
        return Finishes(start, series[0], series[1])

    def _minute(self, state: str, begin: int, settled_before: int) -> int:
        """How many sagas reached ``state`` (final) in the minute from ``begin``. A final saga
        is never written again (retention deletes it days later, not within the hour shown),
        so the count of a minute long past is kept and not asked for again; a late clock can
        still date a write a little in the past, so not in the last ``SETTLED_AFTER_MS``."""
        key = (state, begin)
        with self._settled_lock:
            known = self._settled.get(key)
        if known is not None:
            return known
        found = self._count(state, begin, begin + MINUTE_MS)
        if begin + MINUTE_MS <= settled_before:
            with self._settled_lock:
                self._settled[key] = found
        return found

    def _forget_before(self, start: int) -> None:
        with self._settled_lock:
            for key in [key for key in self._settled if key[1] < start]:
                del self._settled[key]

    def _count(self, state: str, after_ms: int, before_ms: int) -> int:
        return self._sagas.store.count(SAGA, [state], updated_after_ms=after_ms,
                                       updated_before_ms=before_ms)

    # ------------------------------------------------------------ sagas list

    def page(self, chosen: SagaFilter, cursor: str | None = None, limit: int = 50) -> SagaPage:
        """One page of sagas matching ``chosen``: the store filters by state and definition;
        an id prefix is applied here to at most ``PREFIX_READ`` records per request."""
        if not 1 <= limit <= _MAX_BROWSE:
            raise SagaValidationError(f"limit must be in 1..{_MAX_BROWSE}")
        at = _decode_cursor(cursor, chosen.fingerprint()) if cursor else _At(None, limit, 0)
        store = self._sagas.store
        if not chosen.read_here:
            page = self._browse(chosen, at.cursor, limit)
            after = None if page.cursor is None else _At(page.cursor, limit, 0).encode(chosen)
            matching = store.count(SAGA, chosen.browsed_states, label=chosen.definition,
                                   updated_before_ms=chosen.updated_before_ms)
            return SagaPage(page.records, page.corrupt, after, len(page.records) + len(page.corrupt),
                            matching=matching)
        if chosen.id_prefix is not None and isinstance(store, PrefixScan):
            return self._by_prefix(store, chosen, chosen.id_prefix, at, limit)
        return self._filtered(chosen, at, limit)

    def _by_prefix(self, store: PrefixScan, chosen: SagaFilter, prefix: str, at: _At,
                   limit: int) -> SagaPage:
        """One page of the store's prefix scan (an index range on the ids; states and
        definition filtered there, the time and error code here): never a "none among N
        read" while matches exist."""
        page = store.scan_prefix(SAGA, prefix, chosen.browsed_states, label=chosen.definition,
                                 cursor=at.cursor, limit=limit)
        records: list[SagaRecord] = []
        corrupt: list[CorruptRecord] = []
        for envelope in page.items:
            if chosen.updated_before_ms is None or envelope.updated_at_ms < chosen.updated_before_ms:
                self._decode(envelope, records, corrupt)
        if chosen.error_code:
            records = [r for r in records if _has_code(r, chosen.error_code)]
        after = None if page.cursor is None else _At(page.cursor, limit, 0).encode(chosen)
        return SagaPage(tuple(records), tuple(corrupt), after, len(page.items), False,
                        self.saga(prefix))

    def _browse(self, chosen: SagaFilter, cursor: str | None, limit: int) -> RecordPage[SagaRecord]:
        """One page of ``sagas.browse``: in index order, or by last write or creation
        (``order``: the store merges its indexes, ``OrderedScan``)."""
        return self._sagas.browse(states=chosen.browsed_states, definition=chosen.definition,
                                  updated_before_ms=chosen.updated_before_ms, cursor=cursor,
                                  limit=limit, order=chosen.order)

    def _filtered(self, chosen: SagaFilter, at: _At, limit: int) -> SagaPage:
        """Pages of the store's scan (states, definition and time filtered there), of which
        only the records whose id starts with the prefix are decoded, and only those with the
        error code kept; at most ``PREFIX_READ`` read."""
        prefix = chosen.id_prefix or ""
        exact = self.saga(prefix) if prefix else None
        records: list[SagaRecord] = []
        corrupt: list[CorruptRecord] = []
        read = 0
        while True:
            # A page is read again with the size it was first read with, so ``skip`` counts
            # the same items.
            size = at.size if at.skip else min(_MAX_BROWSE, PREFIX_READ - read)
            page = self._sagas.store.scan(SAGA, chosen.browsed_states, label=chosen.definition,
                                          updated_before_ms=chosen.updated_before_ms,
                                          cursor=at.cursor, limit=size)
            for index in range(at.skip, len(page.items)):
                read += 1
                envelope = page.items[index]
                if envelope.id.startswith(prefix):
                    self._decode(envelope, records, corrupt)
                    if chosen.error_code and records and records[-1].saga_id == envelope.id \
                            and not _has_code(records[-1], chosen.error_code):
                        records.pop()
                full = len(records) + len(corrupt) == limit
                if full or read >= PREFIX_READ:
                    after = _At(at.cursor, size, index + 1) if index + 1 < len(page.items) else \
                        None if page.cursor is None else _At(page.cursor, size, 0)
                    return SagaPage(tuple(records), tuple(corrupt),
                                    None if after is None else after.encode(chosen), read,
                                    not full and after is not None, exact)
            if page.cursor is None:
                return SagaPage(tuple(records), tuple(corrupt), None, read, False, exact)
            at = _At(page.cursor, size, 0)

    def _decode(self, envelope: Envelope, records: list[SagaRecord],
                corrupt: list[CorruptRecord]) -> None:
        try:
            records.append(self._codec.saga(envelope, envelope.id, display=True))
        except InvalidRecordError:
            corrupt.append(CorruptRecord(SAGA, envelope.id, "failed read validation"))

    # ------------------------------------------------------------ one saga

    def saga(self, saga_id: str) -> SagaRecord | None:
        """The saga record, or None (also for an id that cannot exist)."""
        try:
            return self._sagas.get(saga_id)
        except SagaValidationError:
            return None

    def approvals_of(self, record: SagaRecord) -> list[ApprovalView]:
        """The approvals of the saga's gates that still wait (pending, or approved and unused)."""
        found = []
        for step in record.steps:
            if step.approval_id is None or not awaiting_decision(step):
                continue
            approval = self._approval(step.approval_id)
            if approval is not None and approval.state in ("pending", "approved"):
                found.append(approval)
        return found

    def _approval(self, approval_id: str) -> ApprovalView | None:
        try:
            record = self._sagas.approvals.get(approval_id)
        except SagaConfigurationError:
            return None  # approvals are not configured in this process: nothing to show
        return None if record is None else ApprovalView.of(record)

    def payload(self, value: Any) -> str:
        """A payload as indented JSON; ``<encrypted>`` where no key could decrypt it
        (``celery_sagas.ENCRYPTED``)."""
        return json.dumps(_redact(value, celery_sagas.ENCRYPTED), indent=2, sort_keys=True,
                          ensure_ascii=False)

    # ------------------------------------------------------------ findings and approvals

    def findings(self, cursor: str | None = None, limit: int = 25,
                 kind: str | None = None) -> FindingRows:
        """One page of the sagas needing an operator (one finding per saga), oldest first
        within the page, of one ``kind`` when given (pages of the walk are read until the
        page is full or ``_QUEUE_PAGES`` were read); SagaValidationError for a bad cursor."""
        if kind is not None and kind not in _KINDS:
            raise SagaValidationError(f"unknown finding kind {kind!r}")
        found: list[Finding] = []
        for _ in range(_QUEUE_PAGES if kind else 1):
            page = self._sagas.findings("sagas", cursor=cursor, limit=limit)
            found += [f for f in page.findings if kind is None or str(f.kind) == kind]
            cursor = page.cursor
            if cursor is None or len(found) >= limit:
                break
        return FindingRows(tuple(sorted(found, key=lambda f: f.updated_at_ms or 0)), cursor)

    def approvals_waiting(self, cursor: str | None = None, limit: int = 25) -> ApprovalPage:
        """One page of pending approvals whose gate still waits, oldest first."""
        page = self._scans.approvals([ApprovalState.PENDING], cursor=cursor, limit=limit)
        live = [r for r in page.records if live_gate(r, self.saga)]
        return ApprovalPage(tuple(ApprovalView.of(r) for r in live), page.corrupt, page.cursor)

    # ------------------------------------------------------------ actions

    def resolve(self, by: Principal, saga_id: str, step: str, effect_id: str, outcome: str, *,
                result: Any = None, error_code: str | None = None,
                reason: str | None = None) -> SagaRecord:
        """Settle an unknown outcome, as ``sagas.resolve`` (same refusals), recorded in the
        saga's history as done by ``by`` for ``reason``."""
        return self._act("resolve", by, saga_id, lambda: self._sagas.resolve(
            saga_id, step, effect_id, outcome, result=result, error_code=error_code,
            actor=by.name, reason=reason))

    def resume(self, by: Principal, saga_id: str, reason: str | None = None) -> SagaRecord:
        """Lift manual review and drive the saga on, as ``sagas.resume``."""
        return self._act("resume", by, saga_id,
                         lambda: self._sagas.resume(saga_id, actor=by.name, reason=reason))

    def cancel(self, by: Principal, saga_id: str, reason: str | None = None) -> SagaRecord:
        """Stop the saga and compensate, as ``sagas.cancel``."""
        return self._act("cancel", by, saga_id,
                         lambda: self._sagas.cancel(saga_id, actor=by.name, reason=reason))

    def approve(self, by: Principal, approval_id: str, reason: str | None = None) -> ApprovalView:
        """Approve a pending approval in its own tenant, decided by ``by``."""
        return self._decide(by, approval_id, "approved", reason)

    def deny(self, by: Principal, approval_id: str, reason: str | None = None) -> ApprovalView:
        """Deny a pending approval (the saga compensates what came before the gate)."""
        return self._decide(by, approval_id, "denied", reason)

    def signal(self, by: Principal, saga_id: str, name: str, payload: Any = None,
               signal_id: str | None = None) -> None:
        """Send a signal to a saga, as ``sagas.signal`` (only where the facade has it)."""
        send = getattr(self._sagas, "signal", None)
        if not callable(send):
            raise SagaValidationError("this version of celery_sagas has no signals")
        self._act("signal", by, saga_id,
                  lambda: send(saga_id, name, payload=payload, signal_id=signal_id,
                               actor=by.name))

    def _decide(self, by: Principal, approval_id: str, decision: str,
                reason: str | None) -> ApprovalView:
        action = {"approved": "approve", "denied": "deny"}[decision]

        def decide() -> ApprovalRecord:
            values.approval_id(approval_id)
            known = self._sagas.approvals.get(approval_id)
            if known is None:
                raise SagaNotFound(f"no approval {approval_id!r}")
            return self._sagas.approvals.decide(approval_id, tenant_id=known.tenant_id,
                                                decision=decision, decided_by=by.name,
                                                reason=reason)

        return ApprovalView.of(self._act(action, by, None, decide, approval_id=approval_id))

    def _act(self, action: str, by: Principal, saga_id: str | None, call: Callable[[], T], *,
             approval_id: str | None = None) -> T:
        try:
            done = call()
        except Exception as exc:
            self.announce(OperatorAction.of(action, by, saga_id, approval_id, type(exc).__name__))
            raise
        if isinstance(done, ApprovalRecord):
            saga_id = done.saga_id
        self.announce(OperatorAction.of(action, by, saga_id, approval_id))
        return done


# ---------------------------------------------------------------- helpers


@dataclass(frozen=True, slots=True)
class _At:
    """Where a sagas list page starts: a browse cursor, the size that page was read with,
    and how many of its items earlier pages showed."""

    cursor: str | None
    size: int
    skip: int

    def encode(self, chosen: SagaFilter) -> str:
        """The opaque cursor, tied to ``chosen``."""
        return values.cursor_text([_CURSOR_VERSION, self.cursor, self.size, self.skip,
                                   chosen.fingerprint()])


def _decode_cursor(cursor: str, fingerprint: str) -> _At:
    """Where the page a cursor names starts (SagaValidationError when it is not one of ours)."""
    version, store_cursor, size, skip, made_for = values.cursor_fields(
        cursor, "sagas", count=5, max_len=_MAX_CURSOR)
    numbers = type(size) is int and type(skip) is int and 0 <= skip < size <= _MAX_BROWSE
    if version != _CURSOR_VERSION or not (store_cursor is None or isinstance(store_cursor, str)) \
            or not numbers:
        raise SagaValidationError("malformed sagas cursor")
    if made_for != fingerprint:
        raise SagaValidationError("this cursor belongs to another filter; start from the first page")
    return _At(store_cursor, size, skip)


def _has_code(record: SagaRecord, code: str) -> bool:
    """True when the saga, or one of its steps, carries the error code ``code``."""
    return record.error_code == code or any(step.error_code == code for step in record.steps)


def _redact(value: Any, marker: object) -> Any:
    if marker is not None and value is marker:
        return ENCRYPTED_TEXT
    if isinstance(value, dict):
        return {key: _redact(item, marker) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact(item, marker) for item in value]
    return value
