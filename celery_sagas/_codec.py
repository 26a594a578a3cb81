"""Records to envelopes and back, with read validation (docs/design.md §2, §4.1).

A record travels to a store as an ``Envelope``: version, state and updated_at_ms ride in the
envelope (the store indexes them), a saga's definition is its label, the earliest time a saga
needs looking at again is its due time, and everything else is the JSON body. Encoding writes
every field that is set; decoding checks each against the table below and raises
``InvalidRecordError`` for anything off, so a corrupt record is never acted on. A saga record's
notes (claims appended without a read) are applied to it on the way in.

With encryption keys (docs/design.md §7) the payload fields (``_PAYLOADS``) of a saga body are
sealed together into one Fernet token under ``sealed``; each keeps its key in the body with a
``null`` in its place, so the record's shape (ids, states, names, times, codes) stays readable
without keys. A sealed record no listed key opens raises ``UndecryptableRecord`` (never
``InvalidRecordError``: it is intact), or, read for display, comes back with ``ENCRYPTED`` in
each sealed field. A codec without keys reads plain records unchanged and costs nothing extra.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import Enum
from functools import cache
from typing import Any

from . import _values as values
from ._crypto import Sealer, sealer_of
from ._frozen import replace
from ._history_codec import history_prefix, read_history
from ._protocol.due import due_at
from ._protocol.notes import apply_notes, parse_note
from ._records import (
    APPROVAL,
    ENCRYPTED,
    SAGA,
    ApprovalRecord,
    ApprovalState,
    EffectMark,
    EffectState,
    ParentRef,
    SagaRecord,
    SagaState,
    SignalRecord,
    StepRecord,
    StepState,
)
from .errors import InvalidRecordError, PayloadTooLarge, SagaValidationError, UndecryptableRecord
from .stores.base import Envelope

__all__ = ["Codec", "carries_write", "new_write_id", "stamped"]

Check = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class _Field:
    """How one body field is read back: its JSON type, whether it may be absent, its check."""

    kind: type | None
    optional: bool = False
    check: Check | None = None


def _need(kind: type | None, check: Check | None = None) -> _Field:
    return _Field(kind, False, check)


def _maybe(kind: type, check: Check | None = None) -> _Field:
    return _Field(kind, True, check)


def _decider(value: object) -> str:
    return values.principal_id(value, field="decided by")


def _mark(value: dict[str, Any]) -> EffectMark:
    """An effect mark read back; ValueError when anything is off."""
    state, at, attempt, code = (value.get(k) for k in ("state", "at_ms", "attempt", "error_code"))
    if set(value) - {"state", "at_ms", "attempt", "error_code"} or type(at) is not int \
            or type(attempt) is not int or not isinstance(state, str):
        raise ValueError("malformed effect mark")
    return EffectMark(EffectState(state), values.timestamp_ms(at), attempt,
                      None if code is None else values.error_code(code))


def _patches(value: list[Any]) -> tuple[str, ...]:
    """The patch ids of a saga read back."""
    return tuple(values.change_id(v) for v in value)


def _parent(value: dict[str, Any]) -> ParentRef:
    """A child saga's parent reference read back; ValueError when anything is off."""
    if set(value) != {"saga_id", "step"}:
        raise ValueError("malformed parent")
    return ParentRef(values.saga_id(value["saga_id"]), values.step_name(value["step"]))


def _signals(value: list[Any]) -> tuple[SignalRecord, ...]:
    fail = ValueError("malformed signal")
    signals = []
    for item in value:
        if type(item) is not dict or set(item) - set(_SIGNAL):
            raise fail
        try:
            read = _read(item, _SIGNAL, InvalidRecordError())
        except InvalidRecordError:
            raise fail from None
        signals.append(SignalRecord(**{**read, "payload": item.get("payload")}))
    return tuple(signals)


_STEP: dict[str, _Field] = {
    "name": _need(str, values.step_name),
    "task": _need(str),
    "effect_id": _need(str, values.effect_id),
    "compensation_effect_id": _need(str, values.effect_id),
    "state": _need(str, StepState),
    "args": _need(list, tuple),
    "kwargs": _need(dict),
    "compensator": _maybe(str),
    "result": _Field(None, True),
    "attempts": _need(int),
    "compensation_attempts": _need(int),
    "next_attempt_at_ms": _maybe(int),
    "started_at_ms": _maybe(int),
    "claimed_by": _maybe(str),
    "dispatched_at_ms": _maybe(int),
    "time_limit_ms": _maybe(int),
    "committed_at_ms": _maybe(int),
    "error_code": _maybe(str),
    "approval_id": _maybe(str),
    "group": _maybe(str),
    "wake_at_ms": _maybe(int),
    "execution": _maybe(dict, _mark),
    "compensation": _maybe(dict, _mark),
    "exception": _maybe(str),
    "outcome_unknown": _maybe(bool),
    "traceback": _maybe(str),
}

_SIGNAL: dict[str, _Field] = {
    "signal_id": _need(str, values.signal_id),
    "name": _need(str, values.signal_name),
    "payload": _Field(None, True),
    "sent_at_ms": _need(int, values.timestamp_ms),
    "consumed_by": _maybe(str, values.step_name),
}

_SAGA: dict[str, _Field] = {
    "definition": _need(str, values.definition_name),
    "input": _Field(None, True),
    "created_at_ms": _need(int),
    "error_code": _maybe(str),
    "reason": _maybe(str),
    "rolling_back": _maybe(bool),
    "trace_parent": _maybe(str, values.traceparent),
    "exception": _maybe(str),
    "patches": _maybe(list, _patches),
    "signals": _maybe(list, _signals),
    "result": _Field(None, True),
    "parent": _maybe(dict, _parent),
    "signals_dropped": _maybe(int),
    "traceback": _maybe(str),
}

_APPROVAL: dict[str, _Field] = {
    "effect_id": _need(str, values.effect_id),
    "capability": _need(str, values.capability),
    "tenant_id": _need(str, values.tenant_id),
    "principal_id": _need(str, values.principal_id),
    "token_hash": _need(str, values.digest),
    "created_at_ms": _need(int),
    "expires_at_ms": _need(int),
    "target": _maybe(str, values.target),
    "digest": _maybe(str, values.digest),
    "decided_by": _maybe(str, _decider),
    "saga_id": _maybe(str, values.saga_id),
    "step": _maybe(str, values.step_name),
    "nonce": _maybe(str, values.nonce),
}

# Payload fields (docs/design.md §7): what encryption seals. ``None`` is the saga body itself; a
# list field of the body (``steps``) stands for each of its items. Each entry gives the table
# its fields are read with and the payload fields; a new payload field is one entry here.
_PAYLOADS: dict[str | None, tuple[Mapping[str, _Field], tuple[str, ...]]] = {
    None: (_SAGA, ("input", "result", "exception")),  # an exception's message may quote a payload
    "steps": (_STEP, ("args", "kwargs", "result", "exception")),
    "signals": (_SIGNAL, ("payload",)),
}
_SEALED = "sealed"  # the body key of the token

# A payload the keys could not open: (list field or None, item index, field name).
Slot = tuple[str | None, int, str]

# Fields the envelope carries, never the body.
_ENVELOPED = frozenset({"state", "version", "updated_at_ms"})
# The history goes in front of the body's JSON (``_history_codec``), never through ``_body``.
_SAGA_ENVELOPED = _ENVELOPED | {"saga_id", "history", "history_folded"}
_APPROVAL_ENVELOPED = _ENVELOPED | {"approval_id"}


@cache
def _field_names(cls: type, skip: frozenset[str]) -> tuple[str, ...]:
    """The fields of a record class a body carries, in declaration order."""
    return tuple(f.name for f in fields(cls) if f.name not in skip)


# Types json writes as they are (what decoding JSON gives back; tuples are written as arrays).
_PLAIN = frozenset({str, int, float, bool, dict, list, tuple})


def _json(value: Any) -> Any:
    """A field value as JSON sees it (payloads were checked when they entered)."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (EffectMark, ParentRef)):
        return _body(value, frozenset())
    if isinstance(value, Mapping):
        return dict(value)
    return value


# Saga fields added later are left out while empty: older records read back unchanged.
_OMITTED_WHEN_EMPTY = frozenset({"patches", "signals", "signals_dropped"})


def _body(record: Any, skip: frozenset[str]) -> dict[str, Any]:
    """Every field of a record that is set, JSON-ready (the generic half of the codec)."""
    return _body_writer(record.__class__, skip)(record)


@cache
def _body_writer(cls: type, skip: frozenset[str]) -> Callable[[Any], dict[str, Any]]:
    """The function that writes the body of a ``cls`` record, built once per class: a
    record's fields read by name, a plain value kept as it is without a call (a record is
    encoded with every write of its saga, each step again; docs/performance.md)."""
    lines = ["def write(record):", "    out = {}"]
    for name in _field_names(cls, skip):
        lines.append(f"    value = record.{name}")
        if name in _OMITTED_WHEN_EMPTY:
            lines.append("    if value:")  # None, and empty too, is left out
        else:
            lines.append("    if value is not None:")
        if name in ("steps", "signals"):
            lines.append(f"        out[{name!r}] = [_body(item, _NOTHING) for item in value]")
        else:
            lines.append(f"        out[{name!r}] = value if type(value) in _PLAIN else _json(value)")
    lines.append("    return out")
    scope: dict[str, Any] = {"_body": _body, "_json": _json, "_PLAIN": _PLAIN,
                             "_NOTHING": frozenset()}
    exec("\n".join(lines), scope)  # generated from the class's own field names
    write: Callable[[Any], dict[str, Any]] = scope["write"]
    return write


def _encoded(body: dict[str, Any], field: str, limit: int) -> str:
    """Canonical JSON of a record body within ``limit`` bytes. The payloads in it were checked
    when they entered (input, arguments, results), so it is written without walking them again;
    anything JSON cannot carry still fails here, as a validation error."""
    try:
        text = _ENCODER.encode(body)
    except (TypeError, ValueError) as exc:
        # Never the text itself: an exception carrying the record would put it in logs.
        raise SagaValidationError(f"{field} is not JSON-serialisable ({type(exc).__name__})") from None
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise SagaValidationError(f"{field} contains a lone surrogate (not valid UTF-8)") from None
    if size > limit:
        raise PayloadTooLarge(f"{field} is {size} bytes, over the {limit}-byte limit",
                              size=size, limit=limit)
    return text


_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"),
                            sort_keys=True)


def _holders(body: dict[str, Any]) -> list[tuple[str | None, int, dict[str, Any]]]:
    """The dicts of a body that hold payload fields: the body itself, then each list item."""
    found: list[tuple[str | None, int, dict[str, Any]]] = [(None, 0, body)]
    for list_name in _PAYLOADS:
        items = body.get(list_name) if list_name is not None else None
        if isinstance(items, list):
            found.extend((list_name, i, item) for i, item in enumerate(items) if type(item) is dict)
    return found


def _seal(body: dict[str, Any], sealer: Sealer) -> dict[str, Any]:
    """Move every payload of ``body`` into one token (a ``null`` keeps each one's place)."""
    payloads = []
    for list_name, _, holder in _holders(body):
        for name in _PAYLOADS[list_name][1]:
            if name in holder:
                payloads.append(holder[name])
                holder[name] = None
    if payloads:
        body[_SEALED] = sealer.seal(_ENCODER.encode(payloads))
    return body


def _unseal(raw: dict[str, Any], sealer: Sealer | None, fail: InvalidRecordError) -> list[Slot] | None:
    """Put the sealed payloads back into ``raw``; None when done, else the slots no key opened
    (each given a neutral value so the record still reads)."""
    token = raw.pop(_SEALED)
    slots = [(list_name, index, name, holder)
             for list_name, index, holder in _holders(raw)
             for name in _PAYLOADS[list_name][1] if name in holder and holder[name] is None]
    if type(token) is not str:
        raise fail
    if not slots:
        return None
    text = None if sealer is None else sealer.open(token)
    if text is None:
        for list_name, _, name, holder in slots:
            spec = _PAYLOADS[list_name][0][name]
            holder[name] = None if spec.optional or spec.kind is None else spec.kind()
        return [(list_name, index, name) for list_name, index, name, _ in slots]
    try:
        payloads = values.decode_json(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise fail from exc
    if type(payloads) is not list or len(payloads) != len(slots):
        raise fail
    for (_, _, name, holder), payload in zip(slots, payloads, strict=True):
        holder[name] = payload
    return None


def _mark_encrypted(record: SagaRecord, slots: list[Slot]) -> SagaRecord:
    """``record`` with ``ENCRYPTED`` in every slot the keys could not open."""
    changes: dict[str, Any] = {name: ENCRYPTED for list_name, _, name in slots if list_name is None}
    for list_name in {list_name for list_name, _, _ in slots if list_name is not None}:
        items = list(getattr(record, list_name))
        for owner, index, name in slots:
            if owner == list_name:
                items[index] = replace(items[index], **{name: ENCRYPTED})
        changes[list_name] = tuple(items)
    return replace(record, **changes)


def _read(raw: Any, table: Mapping[str, _Field], fail: InvalidRecordError) -> dict[str, Any]:
    """Check a decoded body against ``table``; the values to build the record from. Decoded
    JSON has exact types (``bool`` is never taken for ``int``), so a type is checked with ``is``."""
    if type(raw) is not dict:
        raise fail
    out: dict[str, Any] = {}
    get = raw.get
    for name, spec in table.items():
        value = get(name)
        if value is None:
            if not spec.optional:
                raise fail
            continue
        if spec.kind is not None and type(value) is not spec.kind:
            raise fail
        try:
            out[name] = spec.check(value) if spec.check is not None else value
        except (SagaValidationError, ValueError):
            raise fail from None
    return out


def _open(envelope: Envelope | None, kind: str, record_id: str) -> tuple[Any, InvalidRecordError]:
    fail = InvalidRecordError(kind=kind, record_id=record_id)
    if envelope is None or envelope.kind != kind or envelope.id != record_id:
        raise fail
    if type(envelope.version) is not int or envelope.version < 1:
        raise fail
    if type(envelope.updated_at_ms) is not int or envelope.updated_at_ms < 0:
        raise fail
    try:
        raw = values.decode_json(envelope.body)
    except (ValueError, TypeError, RecursionError) as exc:
        raise fail from exc
    created = raw.get("created_at_ms") if isinstance(raw, dict) else None
    if type(created) is not int or not 0 <= created <= envelope.updated_at_ms:
        raise fail
    return raw, fail


def _state(enum: type[Any], value: str, fail: InvalidRecordError) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise fail from None


def new_write_id() -> str:
    """A fresh id for one attempt at a compare-and-set (16 hex digits)."""
    return secrets.token_hex(8)


def stamped(envelope: Envelope, *, limit: int = values.DEFAULT_PAYLOAD_LIMIT,
            write_id: str | None = None) -> Envelope:
    """Add ``write_id`` (a fresh random one by default) to the body so no two writers send the
    same record, and the record names the write that stored it.

    A store reports a compare-and-set whose exact record is already stored as applied, so a
    driver retry is harmless; two writers that computed the same next record from the same
    version would otherwise both be told they won. A writer whose reply was lost reads the
    record back and finds its own write id there if its write was applied (``carries_write``).
    Decoders ignore the extra key. The key is appended to the canonical JSON text (it sorts
    after every record key, so the body stays canonical) instead of decoding and encoding the
    body again; ``limit`` bounds the result.
    """
    body = envelope.body
    if not (body.startswith("{") and body.endswith("}")):
        raise SagaValidationError(f"{envelope.kind} record body is not a JSON object")
    separator = "" if body == "{}" else ","
    text = f'{body[:-1]}{separator}"write_id":"{write_id or new_write_id()}"}}'
    if len(text) > limit and len(text.encode("utf-8")) > limit:
        raise PayloadTooLarge(f"{envelope.kind} record is over the {limit}-byte limit")
    return replace(envelope, body=text)


def carries_write(envelope: Envelope, write_id: str) -> bool:
    """Whether the stored ``envelope`` is the record written with ``write_id`` (notes appended
    since do not change its body); a text check, nothing decoded."""
    return envelope.body.endswith(f'"write_id":"{write_id}"}}')


# Compensating adds bounded fields to a saga (its error code and reason) and to each step (the
# compensation's state, attempts, mark, code and times): a saga that turns back may pass the
# payload limit by that much, never more (history is outside the limit already).
_ROLLBACK_ROOM = 4 * 1024
_ROLLBACK_ROOM_PER_STEP = 1024
_WRITE_ID_ROOM = 64  # bytes the write id adds beyond the payload limit


class Codec:
    """Encodes and decodes saga and approval records for one payload limit (bytes), sealing
    payloads with ``encryption_keys`` (Fernet keys, newest first) when given."""

    def __init__(self, payload_limit: int = values.DEFAULT_PAYLOAD_LIMIT, *,
                 encryption_keys: Sequence[str | bytes] = ()) -> None:
        self.payload_limit = payload_limit
        self._sealer = sealer_of(encryption_keys)

    @property
    def encrypts(self) -> bool:
        """True when this codec seals payloads."""
        return self._sealer is not None

    def __repr__(self) -> str:
        return f"Codec(payload_limit={self.payload_limit}, encrypts={self.encrypts})"

    # ------------------------------------------------------------ sagas

    def saga_limit(self, record: SagaRecord) -> int:
        """The bytes ``record`` may encode to: the payload limit; for a saga that turns back,
        or goes to review, also the room compensating or the review's reason take, so a saga
        at its limit can always be undone, and a step outcome too large to keep is still
        recorded as ``payload_too_large`` (docs/concepts.md "Limits")."""
        turning = record.rolling_back or record.state is SagaState.MANUAL_REVIEW
        if record.version <= 1 or not turning:
            return self.payload_limit  # a new saga fits the limit, or is not created
        return self.payload_limit + _ROLLBACK_ROOM + _ROLLBACK_ROOM_PER_STEP * len(record.steps)

    def saga_envelope(self, record: SagaRecord, *, stamp: bool = False,
                      write_id: str | None = None) -> Envelope:
        """Encode a saga record; refuses non-JSON payloads and bodies over the limit. With
        ``stamp`` the body carries ``write_id`` (a fresh one when None)."""
        body = _body(record, _SAGA_ENVELOPED)
        # The limit bounds the plain record; sealed, it is stored about a third larger.
        limit = self.saga_limit(record)
        text = _encoded(body, "saga record", limit)
        if self._sealer is not None:
            text = _ENCODER.encode(_seal(body, self._sealer))
            limit = len(text)
        history = history_prefix(record)
        if history:
            text = "{" + history + text[1:]
            limit += len(history.encode("utf-8"))
        envelope = Envelope(SAGA, record.saga_id, record.version, str(record.state),
                            record.updated_at_ms, text, record.definition, due_at(record))
        if not stamp:
            return envelope
        return stamped(envelope, limit=limit + _WRITE_ID_ROOM, write_id=write_id)

    def saga(self, envelope: Envelope | None, saga_id: str, *, display: bool = False) -> SagaRecord:
        """Decode and validate a saga record read for ``saga_id``, its notes applied.

        A record sealed with a key not listed raises ``UndecryptableRecord``; with ``display``
        it comes back with ``ENCRYPTED`` in each payload instead (to show, never to act on).
        """
        raw, fail = _open(envelope, SAGA, saga_id)
        assert envelope is not None
        try:
            history, folded = read_history(raw, fail)
        except ValueError:
            raise fail from None
        opaque = _unseal(raw, self._sealer, fail) if _SEALED in raw else None
        if opaque is not None and not display:
            raise UndecryptableRecord(kind=SAGA, record_id=saga_id)
        read = _read(raw, _SAGA, fail)
        steps = raw.get("steps")
        if not isinstance(steps, list):
            raise fail
        record = SagaRecord(
            saga_id=saga_id,
            state=_state(SagaState, envelope.state, fail),
            updated_at_ms=envelope.updated_at_ms,
            version=envelope.version,
            steps=tuple(self._step(step, fail) for step in steps),
            input=raw.get("input"),
            **{k: v for k, v in read.items() if k not in ("input", "result")},
            result=raw.get("result"),
            history=history,
            history_folded=folded,
        )
        _check_unique(record, fail)
        if opaque:
            record = _mark_encrypted(record, opaque)
        if not envelope.notes:
            return record
        try:
            return apply_notes(record, [parse_note(note) for note in envelope.notes],
                               self.payload_opener(saga_id, display=display))
        except (ValueError, TypeError) as exc:
            raise fail from exc

    def _step(self, raw: Any, fail: InvalidRecordError) -> StepRecord:
        read = _read(raw, _STEP, fail)
        read["result"] = raw.get("result")
        return StepRecord(**read)

    def sealed_with_newest(self, envelope: Envelope) -> bool:
        """Whether a saga body's payloads are sealed with this codec's newest key (or it has
        none to seal); False for payloads in clear or sealed with an older key."""
        if self._sealer is None:
            return False
        try:
            raw = values.decode_json(envelope.body)
        except (ValueError, TypeError, RecursionError):
            return False
        if type(raw) is not dict:
            return False
        token = raw.get(_SEALED)
        if type(token) is str:
            return self._sealer.is_newest(token)
        return not any(name in holder for list_name, _, holder in _holders(raw)
                       for name in _PAYLOADS[list_name][1])

    # ------------------------------------------------------------ payloads outside a body

    def payload_out(self, payload: Any) -> dict[str, Any]:
        """A payload stored outside a saga body (a signal note, docs/design.md §3.5), as the JSON
        object to store: ``{"payload": value}`` in clear, ``{"sealed": token}`` with keys."""
        if self._sealer is None:
            return {"payload": payload}
        return {_SEALED: self._sealer.seal(_ENCODER.encode(payload))}

    def payload_in(self, stored: Any, *, kind: str, record_id: str, display: bool = False) -> Any:
        """The payload ``payload_out`` stored. No listed key opens it: ``UndecryptableRecord``,
        or ``ENCRYPTED`` with ``display``; malformed: ``InvalidRecordError``."""
        fail = InvalidRecordError(kind=kind, record_id=record_id)
        if type(stored) is not dict or len(stored) != 1:
            raise fail
        if "payload" in stored:
            return stored["payload"]
        token = stored.get(_SEALED)
        if type(token) is not str:
            raise fail
        text = None if self._sealer is None else self._sealer.open(token)
        if text is None:
            if display:
                return ENCRYPTED
            raise UndecryptableRecord(kind=kind, record_id=record_id)
        try:
            return values.decode_json(text)
        except (ValueError, TypeError, RecursionError) as exc:
            raise fail from exc

    def payload_opener(self, saga_id: str, *, display: bool = False) -> Callable[[Any], Any]:
        """What turns a payload ``payload_out`` stored for ``saga_id`` back into the value."""
        return lambda stored: self.payload_in(stored, kind=SAGA, record_id=saga_id,
                                              display=display)

    # ------------------------------------------------------------ approvals

    def approval_envelope(self, record: ApprovalRecord, *, stamp: bool = False) -> Envelope:
        """Encode an approval record (the token hash, never the token)."""
        text = _encoded(_body(record, _APPROVAL_ENVELOPED), "approval record",
                        values.DEFAULT_PAYLOAD_LIMIT)
        envelope = Envelope(APPROVAL, record.approval_id, record.version, str(record.state),
                            record.updated_at_ms, text)
        return stamped(envelope) if stamp else envelope

    def approval(self, envelope: Envelope | None, approval_id: str) -> ApprovalRecord:
        """Decode and validate an approval record read for ``approval_id``."""
        raw, fail = _open(envelope, APPROVAL, approval_id)
        assert envelope is not None
        read = _read(raw, _APPROVAL, fail)
        return ApprovalRecord(
            approval_id=approval_id,
            state=_state(ApprovalState, envelope.state, fail),
            updated_at_ms=envelope.updated_at_ms,
            version=envelope.version,
            **read,
        )


def _check_unique(record: SagaRecord, fail: InvalidRecordError) -> None:
    """Steps repeating a name or an effect id make a record corrupt."""
    names = [s.name for s in record.steps]
    effect_ids = [e for s in record.steps for e in (s.effect_id, s.compensation_effect_id)]
    if len(set(names)) != len(names) or len(set(effect_ids)) != len(effect_ids):
        raise fail
