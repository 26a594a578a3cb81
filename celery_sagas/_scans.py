"""Paged scans that decode what they read (docs/design.md §5, §6).

A sweep must never crash in a loop on one bad record, so a record that fails read validation
is not raised: it comes back beside the good ones as a ``CorruptRecord`` (kind, id, reason)
for the sweep to report before it goes on. A record sealed with a key no longer configured
(docs/design.md §7) comes back the same way, marked ``undecryptable``: intact, but not to be
acted on. Scans made for ``display`` return it as a record with ``ENCRYPTED`` payloads instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from ._codec import Codec
from ._records import APPROVAL, SAGA, ApprovalRecord, ApprovalState, SagaRecord, SagaState
from ._values import MAX_SAFE_INTEGER, printable
from .errors import InvalidRecordError, SagaValidationError, UndecryptableRecord
from .stores.base import Envelope, OrderedScan, OrderKey, Page, StateListing, Store, check_state

__all__ = ["BROWSE_ORDERS", "CorruptRecord", "RecordPage", "Scans"]

# ``Sagas.browse(order=...)``: (newest first, what the store's ``OrderedScan`` sorts by)
BROWSE_ORDERS: dict[str, tuple[bool, OrderKey]] = {
    "newest": (True, "updated"),
    "oldest": (False, "updated"),
    "newest-created": (True, "created"),
    "oldest-created": (False, "created"),
}

R = TypeVar("R")
S = TypeVar("S", bound=Enum)


@dataclass(frozen=True, slots=True)
class CorruptRecord:
    """A record the store returned that failed read validation, or (``undecryptable``) whose
    payloads no configured key decrypts; report it, do not act on it."""

    kind: str
    id: str
    reason: str
    undecryptable: bool = False


@dataclass(frozen=True, slots=True)
class RecordPage(Generic[R]):
    """Decoded records, the corrupt ones found beside them, and the next cursor (or None)."""

    records: tuple[R, ...]
    corrupt: tuple[CorruptRecord, ...]
    cursor: str | None


def _takes(method: Callable[..., object], name: str) -> bool:
    """Whether ``method`` accepts the keyword argument ``name`` (or any, by ``**kwargs``)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # no signature to read: let the call decide
        return True
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)


def _states(enum: type[S], states: Sequence[S | str]) -> list[str]:
    """Validate state names against ``enum``; keep their order, drop repeats."""
    if isinstance(states, str) or not states:
        raise SagaValidationError("states must be a non-empty sequence of state names")
    names: list[str] = []
    for state in states:
        try:
            name = str(enum(state).value)
        except ValueError:
            raise SagaValidationError(f"unknown {enum.__name__}: {state!r}") from None
        if name not in names:
            names.append(name)
    return names


def _unreadable(envelope: Envelope) -> str | None:
    """Why the store's routing fields of ``envelope`` cannot be trusted, or None."""
    if envelope.version == 0 and envelope.body == "":
        return "unreadable in the store (a field missing, malformed or out of range)"
    if not 1 <= envelope.version <= MAX_SAFE_INTEGER:
        return f"version {envelope.version} is outside 1..2**53-1"
    return None


def _decoded(page: Page, kind: str, accept: Callable[[Envelope], bool],
             decode: Callable[[Envelope, str], R]) -> RecordPage[R]:
    records: list[R] = []
    corrupt: list[CorruptRecord] = []
    for envelope in page.items:
        record_id = printable(envelope.id)
        if envelope.kind != kind or not accept(envelope):
            found = printable(f"{envelope.kind}/{envelope.state}")
            corrupt.append(CorruptRecord(kind, record_id, f"scan returned a {found} record"))
            continue
        unreadable = _unreadable(envelope)
        if unreadable is not None:
            corrupt.append(CorruptRecord(kind, record_id, unreadable))
            continue
        try:
            records.append(decode(envelope, envelope.id))
        except UndecryptableRecord:
            corrupt.append(CorruptRecord(kind, record_id, "encrypted with a key not in "
                                         "encryption_keys", undecryptable=True))
        except InvalidRecordError as exc:
            cause = f": {type(exc.__cause__).__name__}" if exc.__cause__ is not None else ""
            corrupt.append(CorruptRecord(kind, record_id, f"failed read validation{cause}"))
    return RecordPage(tuple(records), tuple(corrupt), page.cursor)


def _valid_state(state: str) -> bool:
    try:
        check_state(state)
    except SagaValidationError:
        return False
    return True


class Scans:
    """Decoded, paged scans of saga and approval records over one store (with ``display``,
    sagas no key decrypts come back with ``ENCRYPTED`` payloads: to show, never to act on)."""

    def __init__(self, store: Store, codec: Codec, *, display: bool = False) -> None:
        self.store = store
        self.codec = codec
        self.display = display

    def _saga(self, envelope: Envelope, saga_id: str) -> SagaRecord:
        return self.codec.saga(envelope, saga_id, display=self.display)

    def sagas(
        self, states: Sequence[SagaState | str], *, definition: str | None = None,
        updated_before_ms: int | None = None, bucket: int | None = None,
        cursor: str | None = None, limit: int = 100,
    ) -> RecordPage[SagaRecord]:
        """One page of saga records in ``states`` (of one definition); corrupt ones apart."""
        names = _states(SagaState, states)
        page = self.store.scan(SAGA, names, label=definition, updated_before_ms=updated_before_ms,
                               bucket=bucket, cursor=cursor, limit=limit)
        return _decoded(page, SAGA, lambda e: e.state in names, self._saga)

    def sagas_by_write(
        self, states: Sequence[SagaState | str], *, definition: str | None = None,
        updated_before_ms: int | None = None, newest_first: bool = False,
        cursor: str | None = None, limit: int = 100, by: OrderKey = "updated",
    ) -> RecordPage[SagaRecord]:
        """One page of saga records in ``states`` (of one definition) by last write (or by
        creation, ``by="created"``) across the states, oldest or newest first (the store's
        ``OrderedScan``; SagaValidationError on a store without it)."""
        names = _states(SagaState, states)
        if not isinstance(self.store, OrderedScan):
            raise SagaValidationError("this store cannot list sorted (no OrderedScan)")
        # ``by`` only when not the default: a store written before it still sorts by last write
        chosen: dict[str, OrderKey] = {"by": by} if by != "updated" else {}
        if chosen and not _takes(self.store.scan_ordered, "by"):
            raise SagaValidationError("this store cannot list by creation (its scan_ordered "
                                      "takes no by=)")
        page = self.store.scan_ordered(SAGA, names, label=definition,
                                       updated_before_ms=updated_before_ms,
                                       newest_first=newest_first, cursor=cursor, limit=limit,
                                       **chosen)
        return _decoded(page, SAGA, lambda e: e.state in names, self._saga)

    def due_sagas(self, due_before_ms: int, *, bucket: int | None = None,
                  cursor: str | None = None, limit: int = 100) -> RecordPage[SagaRecord]:
        """One page of sagas whose due time is before ``due_before_ms``; corrupt ones apart."""
        page = self.store.scan_due(SAGA, due_before_ms=due_before_ms, bucket=bucket, cursor=cursor,
                                   limit=limit)
        return _decoded(page, SAGA, lambda e: True, self._saga)

    def strays(self, kind: str, known: Sequence[str], *, bucket: int | None = None,
               cursor: str | None = None, limit: int = 100) -> RecordPage[None]:
        """One page of the records of ``kind`` whose state is none of ``known`` (invisible to
        every other scan), each reported corrupt; nothing on a store without
        ``StateListing``."""
        if not isinstance(self.store, StateListing):
            return RecordPage((), (), None)
        others = [s for s in self.store.stored_states(kind) if s not in known]
        scannable = [s for s in others if _valid_state(s)]
        unscannable = tuple(
            CorruptRecord(kind, "-", f"records in the invalid state {printable(s)!r}")
            for s in others if s not in scannable and cursor is None)
        if not scannable:
            return RecordPage((), unscannable, None)
        try:
            page = self.store.scan(kind, scannable, bucket=bucket, cursor=cursor, limit=limit)
        except SagaValidationError:
            return RecordPage((), (), None)  # the states changed under the cursor: next sweep
        found = tuple(CorruptRecord(kind, printable(e.id), f"unknown state {printable(e.state)!r}")
                      for e in page.items)
        return RecordPage((), unscannable + found, page.cursor)

    def approvals(
        self, states: Sequence[ApprovalState | str], *, updated_before_ms: int | None = None,
        bucket: int | None = None, cursor: str | None = None, limit: int = 100,
    ) -> RecordPage[ApprovalRecord]:
        """One page of approval records in ``states``; corrupt ones returned apart."""
        names = _states(ApprovalState, states)
        page = self.store.scan(APPROVAL, names, updated_before_ms=updated_before_ms, bucket=bucket,
                               cursor=cursor, limit=limit)
        return _decoded(page, APPROVAL, lambda e: e.state in names, self.codec.approval)
