"""Paged scans that decode what they read, and bounded non-paged helpers (SPEC §5).

A sweep must never crash in a loop on one bad record, so a record that fails read validation
is not raised: it comes back beside the good ones as a ``CorruptRecord`` (kind, id, reason)
for the sweep to report before it goes on.

``scan_*`` return one page and a cursor. ``all_*`` walk every page but refuse, with
``SagaValidationError``, when more than ``MAX_SCAN_LIMIT`` (1000) records match: a silently
truncated list would hide work from an operator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from ._records import (
    APPROVAL,
    EFFECT,
    SAGA,
    ApprovalRecord,
    ApprovalState,
    EffectRecord,
    EffectState,
    SagaRecord,
    SagaState,
    approval_from_envelope,
    effect_from_envelope,
    saga_from_envelope,
)
from .errors import InvalidRecordError, SagaValidationError
from .stores.base import MAX_SCAN_LIMIT, Envelope, Store

__all__ = [
    "CorruptRecord",
    "RecordPage",
    "all_approvals",
    "all_effects",
    "all_sagas",
    "scan_approvals",
    "scan_effects",
    "scan_sagas",
]

R = TypeVar("R")
S = TypeVar("S", bound=Enum)


@dataclass(frozen=True, slots=True)
class CorruptRecord:
    """A record the store returned that failed read validation; report it, do not act on it."""

    kind: str
    id: str
    reason: str


@dataclass(frozen=True, slots=True)
class RecordPage(Generic[R]):
    """Decoded records, the corrupt ones found beside them, and the next cursor (or None)."""

    records: tuple[R, ...]
    corrupt: tuple[CorruptRecord, ...]
    cursor: str | None


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


def _decode(
    envelope: Envelope,
    kind: str,
    states: list[str],
    decode: Callable[[Envelope | None, str], R],
) -> R | CorruptRecord:
    if envelope.kind != kind or envelope.state not in states:
        found = f"{envelope.kind}/{envelope.state}"
        return CorruptRecord(kind, envelope.id, f"scan returned a {found} record")
    try:
        return decode(envelope, envelope.id)
    except InvalidRecordError as exc:
        cause = f": {type(exc.__cause__).__name__}" if exc.__cause__ is not None else ""
        return CorruptRecord(kind, envelope.id, f"failed read validation{cause}")


def _scan(
    store: Store,
    kind: str,
    states: list[str],
    decode: Callable[[Envelope | None, str], R],
    updated_before_ms: int | None,
    cursor: str | None,
    limit: int,
) -> RecordPage[R]:
    page = store.scan(kind, states, updated_before_ms=updated_before_ms, cursor=cursor, limit=limit)
    records: list[R] = []
    corrupt: list[CorruptRecord] = []
    for envelope in page.items:
        item = _decode(envelope, kind, states, decode)
        if isinstance(item, CorruptRecord):
            corrupt.append(item)
        else:
            records.append(item)
    return RecordPage(tuple(records), tuple(corrupt), page.cursor)


def _all(
    store: Store,
    kind: str,
    states: list[str],
    decode: Callable[[Envelope | None, str], R],
    updated_before_ms: int | None,
) -> RecordPage[R]:
    records: list[R] = []
    corrupt: list[CorruptRecord] = []
    cursor: str | None = None
    while True:
        # Once 1000 are in hand, ask for one more: a short page with a cursor proves nothing.
        limit = min(MAX_SCAN_LIMIT, MAX_SCAN_LIMIT + 1 - len(records) - len(corrupt))
        page = _scan(store, kind, states, decode, updated_before_ms, cursor, limit)
        records.extend(page.records)
        corrupt.extend(page.corrupt)
        if len(records) + len(corrupt) > MAX_SCAN_LIMIT:
            raise SagaValidationError(
                f"more than {MAX_SCAN_LIMIT} {kind} records match; page with scan_{kind}s instead"
            )
        if page.cursor is None:
            return RecordPage(tuple(records), tuple(corrupt), None)
        cursor = page.cursor


def scan_sagas(
    store: Store,
    states: Sequence[SagaState | str],
    *,
    updated_before_ms: int | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> RecordPage[SagaRecord]:
    """One page of saga records in ``states`` (limit 1..1000); corrupt ones returned apart."""
    names = _states(SagaState, states)
    return _scan(store, SAGA, names, saga_from_envelope, updated_before_ms, cursor, limit)


def scan_effects(
    store: Store,
    states: Sequence[EffectState | str],
    *,
    updated_before_ms: int | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> RecordPage[EffectRecord]:
    """One page of effect records in ``states`` (limit 1..1000); corrupt ones returned apart."""
    names = _states(EffectState, states)
    return _scan(store, EFFECT, names, effect_from_envelope, updated_before_ms, cursor, limit)


def scan_approvals(
    store: Store,
    states: Sequence[ApprovalState | str],
    *,
    updated_before_ms: int | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> RecordPage[ApprovalRecord]:
    """One page of approval records in ``states`` (limit 1..1000); corrupt ones returned apart."""
    names = _states(ApprovalState, states)
    return _scan(store, APPROVAL, names, approval_from_envelope, updated_before_ms, cursor, limit)


def all_sagas(
    store: Store, states: Sequence[SagaState | str], *, updated_before_ms: int | None = None
) -> RecordPage[SagaRecord]:
    """Every matching saga record; raises SagaValidationError when more than 1000 match."""
    names = _states(SagaState, states)
    return _all(store, SAGA, names, saga_from_envelope, updated_before_ms)


def all_effects(
    store: Store, states: Sequence[EffectState | str], *, updated_before_ms: int | None = None
) -> RecordPage[EffectRecord]:
    """Every matching effect record; raises SagaValidationError when more than 1000 match."""
    names = _states(EffectState, states)
    return _all(store, EFFECT, names, effect_from_envelope, updated_before_ms)


def all_approvals(
    store: Store, states: Sequence[ApprovalState | str], *, updated_before_ms: int | None = None
) -> RecordPage[ApprovalRecord]:
    """Every matching approval record; raises SagaValidationError when more than 1000 match."""
    names = _states(ApprovalState, states)
    return _all(store, APPROVAL, names, approval_from_envelope, updated_before_ms)
