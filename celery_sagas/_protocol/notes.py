"""Notes: what is appended to a saga record without reading it first (docs/design.md §3.2).

A delivery claims its step by appending a claim note (``annotate``) instead of reading the
record and writing it back: the note names the step, the effect and the claimer, and the
store bumps the record's version. Whoever reads the record next applies its notes in order,
so every reader sees the same record; the next compare-and-set writes the result and clears
them. A claim that no longer applies (the saga moved on in between: impossible at the version
it was written for, but a note is judged, not trusted) is ignored by every reader alike.

A signal (docs/design.md §3.5) is a note too, appended at the version its sender read and
checked (limits, a final saga, docs/concepts.md "Limits"): applying it adds the
signal to the record's ``signals`` unless a signal with its id is there already, so a repeated
send is one signal. Its payload is kept as the codec stored it (``{"payload": value}``, or a
sealed token where payloads are encrypted, docs/design.md §7): whoever applies notes passes
``open_payload`` to turn it back into the value.

A withdrawal note takes a claim back without reading the record: a delivery that cannot decrypt
the record it just claimed (a worker without the newest key, docs/design.md §7) appends one,
and every reader applies the claim and then its withdrawal (``moves.withdraw_claim``), wherever
the claim is by then (still a note, or written into the body by a reader with the key).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .._frozen import replace
from .._records import (
    AttemptRef,
    HistoryEvent,
    OperatorAction,
    SagaRecord,
    SignalRecord,
    StepRecord,
)
from .._values import (
    actor,
    effect_id,
    json_value,
    reason,
    signal_id,
    signal_name,
    step_name,
    timestamp_ms,
    token,
)
from ..errors import IllegalTransition
from .history import recorded
from .moves import claim_compensation, claim_step, withdraw_claim

__all__ = [
    "ClaimNote", "Note", "OpenPayload", "SignalNote", "WithdrawNote", "apply_notes",
    "clear_payload", "parse_note", "with_signal",
]


@dataclass(frozen=True, slots=True)
class _ClaimerNote:
    """A note about one effect of a step by one claimer (its tag), stored under ``KEY``."""

    KEY: ClassVar[str]
    step: str
    effect_id: str
    claimer: str
    at_ms: int

    def text(self) -> str:
        """The note as stored: one line of JSON."""
        return json.dumps({self.KEY: [self.step, self.effect_id, self.claimer, self.at_ms]},
                          separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class ClaimNote(_ClaimerNote):
    """A delivery's claim of the start of one effect of a step."""

    KEY: ClassVar[str] = "claim"

    def withdrawn(self) -> WithdrawNote:
        """The note that takes this claim back (its body never began)."""
        return WithdrawNote(self.step, self.effect_id, self.claimer, self.at_ms)


@dataclass(frozen=True, slots=True)
class WithdrawNote(_ClaimerNote):
    """A claimer's taking back of its own claim, whose body never began."""

    KEY: ClassVar[str] = "withdraw"


@dataclass(frozen=True, slots=True)
class SignalNote:
    """A signal sent to a saga, appended as a note (docs/design.md §3.5); ``stored`` is
    its payload as the codec stores a payload outside a body (``{"payload": value}``);
    ``actor`` and ``reason`` go to the saga's history (docs/design.md §2.6)."""

    signal_id: str
    name: str
    stored: Any
    at_ms: int
    actor: str | None = None
    reason: str | None = None

    def text(self) -> str:
        """The note as stored: one line of JSON (the four fields of earlier releases when no
        actor or reason is given, so they can read it)."""
        fields: list[Any] = [self.signal_id, self.name, self.stored, self.at_ms]
        if self.actor is not None or self.reason is not None:
            fields += [self.actor, self.reason]
        return json.dumps({"signal": fields}, separators=(",", ":"), sort_keys=True,
                          allow_nan=False)

    def action(self) -> OperatorAction:
        """The signal as its history entry's action (who sent it, and why)."""
        return OperatorAction(HistoryEvent.SIGNAL, self.actor, self.reason, ref=self.signal_id)


OpenPayload = Callable[[Any], Any]


def clear_payload(stored: Any) -> Any:
    """The value of a payload stored in clear (``{"payload": value}``); ValueError otherwise."""
    if type(stored) is not dict or set(stored) != {"payload"}:
        raise ValueError("not a payload in clear")
    return stored["payload"]


Note = ClaimNote | SignalNote | WithdrawNote
_CLAIMER_NOTES: dict[str, type[ClaimNote] | type[WithdrawNote]] = {
    made.KEY: made for made in (ClaimNote, WithdrawNote)}


def parse_note(text: str) -> Note:
    """Read a stored note; ValueError when it is not one this version writes."""
    raw = json.loads(text)
    if not isinstance(raw, dict) or len(raw) != 1:
        raise ValueError("unknown note")
    [(kind, fields)] = raw.items()
    if kind == "signal":
        return _signal_note(fields)
    made = _CLAIMER_NOTES.get(kind)
    if made is None:
        raise ValueError("unknown note")
    if not isinstance(fields, list) or len(fields) != 4:
        raise ValueError(f"malformed {kind} note")
    name, effect, claimer, at = fields
    try:
        return made(step_name(name), effect_id(effect),
                    token(claimer, field="claimer", max_len=255), timestamp_ms(at))
    except Exception as exc:
        raise ValueError(f"malformed {kind} note") from exc


def _signal_note(fields: Any) -> SignalNote:
    if not isinstance(fields, list) or len(fields) not in (4, 6):
        raise ValueError("malformed signal note")
    sent_id, name, stored, at = fields[:4]
    by, why = fields[4:] if len(fields) == 6 else (None, None)
    if type(stored) is not dict or len(stored) != 1 or not set(stored) & {"payload", "sealed"}:
        raise ValueError("malformed signal note")
    try:
        return SignalNote(signal_id(sent_id), signal_name(name),
                          json_value(stored, field="signal payload"), timestamp_ms(at),
                          None if by is None else actor(by), None if why is None else reason(why))
    except Exception as exc:
        raise ValueError("malformed signal note") from exc


def with_signal(saga: SagaRecord, note: SignalNote, payload: Any) -> SagaRecord:
    """The record with the signal (its payload opened) added, unless one with its id is there
    already."""
    if any(s.signal_id == note.signal_id for s in saga.signals):
        return saga
    signal = SignalRecord(note.signal_id, note.name, payload, note.at_ms)
    return replace(saga, signals=(*saga.signals, signal))


def _apply(saga: SagaRecord, note: Note, open_payload: OpenPayload) -> SagaRecord:
    if isinstance(note, SignalNote):
        return with_signal(saga, note, open_payload(note.stored))
    step = saga.step(note.step)
    if step is None:
        return saga
    try:
        if isinstance(note, WithdrawNote):
            return _withdraw(saga, step, note)
        if step.effect_id == note.effect_id:
            return claim_step(saga, note.step, note.effect_id, note.claimer, note.at_ms)
        if step.compensation_effect_id == note.effect_id:
            return claim_compensation(saga, note.step, note.effect_id, note.claimer, note.at_ms)
    except IllegalTransition:
        pass
    return saga


def _withdraw(saga: SagaRecord, step: StepRecord, note: WithdrawNote) -> SagaRecord:
    """The claim ``note`` names taken back, if it still holds the step (IllegalTransition
    otherwise: another claim, or the step moved on)."""
    if step.effect_id == note.effect_id:
        ref = AttemptRef.execution(step)
    elif step.compensation_effect_id == note.effect_id:
        ref = AttemptRef.compensation(step)
    else:
        return saga
    return withdraw_claim(saga, ref, note.claimer, note.at_ms)


def apply_notes(saga: SagaRecord, notes: Sequence[Note],
                open_payload: OpenPayload = clear_payload, *,
                version: int | None = None) -> SagaRecord:
    """The record with its notes applied in order (its version already counts them, or is
    ``version``: the notes just appended to it), each one's transitions in its history
    (docs/design.md §2.6), at the note's time."""
    applied = saga
    for note in notes:
        moved = _apply(applied, note, open_payload)
        if moved is not applied:
            action = note.action() if isinstance(note, SignalNote) else None
            applied = recorded(applied, moved, action=action, at_ms=note.at_ms, limit=None)
    return replace(applied, version=saga.version if version is None else version,
                   updated_at_ms=saga.updated_at_ms)
