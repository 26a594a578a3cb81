"""Frozen records, their states and the value objects moves take (docs/design.md §2).

The model imports no storage: how a record becomes an envelope (and back, with read
validation) is ``_codec.py``'s business.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, overload

__all__ = [
    "APPROVAL",
    "EMPTY_HISTORY",
    "ENCRYPTED",
    "SAGA",
    "ApprovalRecord",
    "ApprovalState",
    "AttemptRef",
    "Binding",
    "EffectMark",
    "EffectRecord",
    "EffectState",
    "Encrypted",
    "History",
    "HistoryEntry",
    "HistoryEvent",
    "OperatorAction",
    "SagaHistory",
    "SagaRecord",
    "SagaState",
    "SignalRecord",
    "StepRecord",
    "StepState",
    "TextEnum",
    "entry_dict",
    "history_of",
]

SAGA = "saga"
APPROVAL = "approval"

# The task names of the step kinds (approval gates, timers, signal waits, child sagas) are
# in the registry of step kinds, ``_protocol/kinds.py`` (docs/design.md §3.11).


class Encrypted:
    """A payload no configured key could decrypt (``celery_sagas.ENCRYPTED``; its ``str`` is
    ``<encrypted>``): what a record read for display holds in place of that payload."""

    __slots__ = ()
    _instance: Encrypted | None = None

    def __new__(cls) -> Encrypted:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<encrypted>"

    __str__ = __repr__

    def __reduce__(self) -> str:
        return "ENCRYPTED"  # pickles as the module's one instance

    def __copy__(self) -> Encrypted:
        return self

    def __deepcopy__(self, memo: object) -> Encrypted:
        return self


ENCRYPTED = Encrypted()
"""What a record read for display holds in place of a payload no configured encryption key
decrypts (docs/design.md §7); ``str(ENCRYPTED)`` is ``<encrypted>``."""


class TextEnum(str, Enum):
    """An enum of strings that prints, logs and serialises as its value."""

    def __str__(self) -> str:
        return str(self.value)


class SagaState(TextEnum):
    """Saga states (docs/design.md §2.1)."""

    RUNNING = "running"
    COMPENSATING = "compensating"
    COMPLETED = "completed"
    COMPENSATED = "compensated"
    MANUAL_REVIEW = "manual-review"

    @property
    def final(self) -> bool:
        """True for states no transition leaves."""
        return self in (SagaState.COMPLETED, SagaState.COMPENSATED)


class StepState(TextEnum):
    """Step states (docs/design.md §2.2)."""

    EXECUTING = "executing"
    WAITING = "waiting"
    AWAITING_APPROVAL = "awaiting-approval"
    COMMITTED = "committed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"
    COMPENSATING = "compensating"
    COMPENSATION_FAILED = "compensation-failed"
    COMPENSATED = "compensated"


class EffectState(TextEnum):
    """Effect states (docs/design.md §2.3)."""

    ADMISSION = "admission"
    EXECUTING = "executing"
    COMMITTED = "committed"
    FAILED = "failed"
    UNKNOWN = "unknown"


class ApprovalState(TextEnum):
    """Approval states (docs/design.md §2.4)."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    CONSUMED = "consumed"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class EffectMark:
    """Where one effect of a step stands (docs/design.md §2.3): its state, when it last moved,
    and the error code that failed it; kept in the step, written with the saga record.

    Attributes:
        state: ``admission``, ``executing``, ``committed``, ``failed`` or ``unknown``; the last
            three never move again.
        at_ms: when the effect last moved (ms since the epoch).
        attempt: the attempt the mark is about (1 for the first claim).
        error_code: the code that failed the effect, if it failed.
    """

    state: EffectState
    at_ms: int
    attempt: int = 0
    error_code: str | None = None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of a saga: its effect ids, state, arguments, result and attempt counters
    (docs/design.md §2.2). Times are ms since the epoch; None means "not yet" or "not now".

    Attributes:
        name: the step's name in its saga: the task name, with ``#2``, ``#3``... when a saga
            calls the same task again, or the ``step_name=`` given to ``ctx.step``.
        task: the Celery task that runs the step (``_protocol.kinds.APPROVAL_TASK`` for a gate).
        effect_id: the execution's effect id: the step task's Celery task id, the same for
            every attempt, and the idempotency key to hand the provider (``saga.effect_id``).
        compensation_effect_id: the compensator task's Celery task id (drawn with the intent).
        state: a ``StepState``: ``executing``, ``waiting``, ``awaiting-approval``, ``committed``,
            ``failed``, ``ambiguous``, ``compensating``, ``compensation-failed`` or
            ``compensated`` (docs/design.md §2.2).
        args: the positional arguments recorded with the intent; the step task and its
            compensator are called with them (the broker message carries none).
        kwargs: the keyword arguments recorded with the intent.
        compensator: the compensator task's name, or None for a step with nothing to undo.
        result: what the step returned (a committed step), or None.
        attempts: how many times the step's execution was claimed (started).
        compensation_attempts: how many times its compensator was claimed.
        next_attempt_at_ms: when the next retry is due (a step released for a retry, or a
            failed compensation), or None.
        started_at_ms: when the current attempt was claimed, or None while none runs.
        claimed_by: who claimed the current attempt (``host:pid/nonce``), for liveness checks.
        dispatched_at_ms: when the step's (or compensator's) message was last sent.
        time_limit_ms: the task's hard time limit; past it plus ``sagas_ambiguity_grace`` a
            silent attempt counts as vanished.
        committed_at_ms: when the step committed, or None.
        error_code: why the step failed, is ambiguous, or its compensation failed (codes in
            docs/guarantees.md), or None.
        approval_id: the approval record of an approval gate step, or None.
        group: the parallel group (``parallel-N``) of a step started by ``ctx.parallel``, or
            None.
        wake_at_ms: when a ``waiting`` step falls due: a timer's wake-up, a signal wait's
            timeout (docs/design.md §3.4, §3.5); None while it waits without a time.
        execution: where the execution effect stands (an ``EffectMark``).
        compensation: where the compensation effect stands, once compensation began.
        exception: the type and message of the exception the step's body (or its compensator)
            last raised (``"TimeoutError: provider did not answer"``), or None. Written by
            your own code, so it is kept with the payloads, never logged by the library.
        traceback: where that exception was raised: its innermost frames, one
            ``"dir/file.py:line in function"`` line each (``_values.traceback_text``), or
            None. Names only, never locals or payloads.
        outcome_unknown: True when the step's outcome was unknown and it is compensated
            anyway, as its ``compensate_unknown=True`` declares (its execution effect stays
            ``unknown``); None otherwise.
    """

    name: str
    task: str
    effect_id: str
    compensation_effect_id: str
    state: StepState
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    compensator: str | None = None
    result: Any = None
    attempts: int = 0
    compensation_attempts: int = 0
    next_attempt_at_ms: int | None = None
    started_at_ms: int | None = None
    claimed_by: str | None = None
    dispatched_at_ms: int | None = None
    time_limit_ms: int | None = None
    committed_at_ms: int | None = None
    error_code: str | None = None
    approval_id: str | None = None
    group: str | None = None
    wake_at_ms: int | None = None
    execution: EffectMark | None = None
    compensation: EffectMark | None = None
    exception: str | None = None
    outcome_unknown: bool | None = None
    traceback: str | None = None


class HistoryEvent(TextEnum):
    """What a history entry records (docs/design.md §2.6)."""

    CREATED = "created"
    STATE = "state"
    INTENT = "intent"
    CLAIMED = "claimed"
    CLAIM_WITHDRAWN = "claim_withdrawn"  # a claim whose body never began, taken back
    RESENT = "resent"
    COMMITTED = "committed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"
    CAUGHT = "caught"  # run caught a step's StepFailed and went on
    RETRY = "retry"
    STEP = "step"
    COMPENSATION_INTENT = "compensation_intent"
    COMPENSATION_CLAIMED = "compensation_claimed"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    COMPENSATION_AMBIGUOUS = "compensation_ambiguous"
    TIMER_SET = "timer_set"
    TIMER_FIRED = "timer_fired"
    SIGNAL_WAIT = "signal_wait"
    SIGNAL = "signal"
    SIGNAL_CONSUMED = "signal_consumed"
    SIGNAL_TIMED_OUT = "signal_timed_out"
    SIGNALS_DROPPED = "signals_dropped"  # unconsumed signals dropped as the saga turned back
    CHILD_STARTED = "child_started"
    CHILD_ENDED = "child_ended"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_DECIDED = "approval_decided"
    ARCHIVED = "archived"
    # Operator actions (with an actor and the reason given).
    RESOLVE = "resolve"
    RESUME = "resume"
    CANCEL = "cancel"
    APPROVE = "approve"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One thing that happened to a saga (docs/design.md §2.6): ids, names, codes and times,
    never a payload. Fields an event has no use for are None.

    Attributes:
        at_ms: when it happened (ms since the epoch).
        event: a ``HistoryEvent``: a step's or the saga's transition, or an operator action.
        step: the step it is about, if any.
        attempt: the attempt of the step's execution (or compensation) it is about; for
            ``signals_dropped``, how many signals were dropped.
        state: the saga's new state (``state``), the step's (``step``, ``child_ended``,
            ``approval_decided``), or the outcome an operator recorded (``resolve``).
        code: the error code (a failure, an ambiguity's cause, why the saga stopped), or a
            signal's name.
        ref: an id: who claimed the attempt, the signal, the child saga, the approval.
        due_ms: when a timer, a signal wait's timeout or a retry falls due.
        actor: who acted (an operator action, a signal, an approval's decision).
        reason: the reason the operator gave; for a ``state`` entry, the saga's reason.
    """

    at_ms: int
    event: HistoryEvent | str  # a str: an event of a later release, read back as written
    step: str | None = None
    attempt: int | None = None
    state: str | None = None
    code: str | None = None
    ref: str | None = None
    due_ms: int | None = None
    actor: str | None = None
    reason: str | None = None


class History(Sequence[HistoryEntry]):
    """A saga's history entries, oldest first: an immutable sequence (docs/design.md §2.6).

    Read from a store, it keeps the entries as the codec parsed them and builds each
    ``HistoryEntry`` only when someone looks: a worker carries the history of the saga it
    writes forward untouched (``appended``), so the hot path never pays for entries nobody
    reads. Equal to any sequence of the same entries.
    """

    __slots__ = ("_decode", "_entries", "_items")

    def __init__(self, entries: Iterable[HistoryEntry] = ()) -> None:
        self._items: tuple[Any, ...] = tuple(entries)
        self._entries: tuple[HistoryEntry, ...] | None = self._items
        self._decode: Callable[[Any], HistoryEntry] | None = None

    @classmethod
    def stored(cls, items: Iterable[Any], decode: Callable[[Any], HistoryEntry]) -> History:
        """Entries as a store holds them, each turned into a ``HistoryEntry`` by ``decode``
        when first read (``decode`` raises for a malformed one)."""
        history = cls()
        history._items, history._entries, history._decode = tuple(items), None, decode
        return history

    @property
    def items(self) -> tuple[Any, ...]:
        """The entries as held: stored ones as read, the others as ``HistoryEntry``."""
        return self._items

    def entries(self) -> tuple[HistoryEntry, ...]:
        """Every entry, built from what was stored if need be."""
        if self._entries is None:
            decode = self._decode
            assert decode is not None
            self._entries = tuple(i if type(i) is HistoryEntry else decode(i)
                                  for i in self._items)
        return self._entries

    def appended(self, new: Sequence[HistoryEntry]) -> History:
        """This history with ``new`` after it (stored entries stay as they were read)."""
        if not new:
            return self
        history = History()
        history._items, history._decode = (*self._items, *new), self._decode
        history._entries = None if self._entries is None else (*self._entries, *new)
        return history

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> HistoryEntry: ...

    @overload
    def __getitem__(self, index: slice) -> History: ...

    def __getitem__(self, index: int | slice) -> HistoryEntry | History:
        if isinstance(index, slice):
            history = History()
            history._items, history._decode = self._items[index], self._decode
            history._entries = None if self._entries is None else self._entries[index]
            return history
        return self.entries()[index]

    def __iter__(self) -> Iterator[HistoryEntry]:
        return iter(self.entries())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (History, tuple, list)):
            return self.entries() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.entries())

    def __repr__(self) -> str:
        return f"History({list(self.entries())!r})"


EMPTY_HISTORY = History()


def history_of(entries: Sequence[HistoryEntry]) -> History:
    """``entries`` as a ``History`` (as they are when they are one)."""
    return entries if isinstance(entries, History) else History(entries)


@dataclass(frozen=True, slots=True)
class SagaRecord:
    """A saga: definition, state, input and the ordered steps recorded so far
    (docs/design.md §2.1). Every write after creation is a compare-and-set on ``version``.

    Attributes:
        saga_id: the saga's id (printable ASCII without spaces, 1..128 characters).
        definition: the name of the ``@sagas.saga`` definition it runs.
        state: a ``SagaState``: ``running``, ``compensating``, ``completed``, ``compensated``
            or ``manual-review``; the first two move on by themselves, ``manual-review`` waits
            for an operator, the others are final.
        input: the input ``start()`` was given (JSON values).
        created_at_ms: when the saga was created (ms since the epoch).
        updated_at_ms: when the record was last written.
        steps: the steps recorded so far, in the order ``run`` asked for them.
        version: 1 at creation, one more with every write.
        error_code: why the saga compensates or waits for an operator (the codes are in
            docs/guarantees.md), or None.
        reason: a sentence for the operator about that code (ids and names, never payloads),
            or None.
        rolling_back: set with the first known failure (or a cancel) and never cleared: which
            way a saga in manual review goes once resumed.
        trace_parent: the W3C ``traceparent`` of the span ``start()`` ran in, when it was
            traced (docs/tracing.md): work started later without the saga's context (a sweep,
            an operator) joins the saga's trace through it. Ids only, never a payload.
        exception: the type and message of the exception ``run`` raised (``run_failed``),
            or None.
        traceback: where ``run`` raised it, as a step's ``traceback`` is (frames, no locals),
            or None.
        patches: the ``ctx.patched`` change ids this saga passed on code that had them
            (docs/design.md §3.6).
        signals: the signals sent to it, in the order they were recorded (docs/design.md §3.5).
        result: the value ``run`` returned, once completed (JSON), or None.
        parent: the parent saga and step of a child saga (docs/design.md §3.7), or None.
        signals_dropped: how many signals no wait had consumed when the saga turned back
            (cancel, a failure): they were dropped from ``signals``.
        history: what happened to the saga, oldest first (docs/design.md §2.6): appended in
            the write of each transition, never rewritten, the oldest folded past the bound.
        history_folded: how many of the oldest entries were folded away by the bound.
    """

    saga_id: str
    definition: str
    state: SagaState
    input: Any
    created_at_ms: int
    updated_at_ms: int
    steps: tuple[StepRecord, ...] = ()
    version: int = 1
    error_code: str | None = None
    reason: str | None = None
    rolling_back: bool = False
    trace_parent: str | None = None
    exception: str | None = None
    patches: tuple[str, ...] = ()
    signals: tuple[SignalRecord, ...] = ()
    result: Any = None
    parent: ParentRef | None = None
    signals_dropped: int = 0
    history: Sequence[HistoryEntry] = EMPTY_HISTORY
    traceback: str | None = None
    history_folded: int = 0

    def step(self, name: str) -> StepRecord | None:
        """The step record with this name, or None."""
        for step in self.steps:
            if step.name == name:
                return step
        return None

    def to_dict(self) -> dict[str, Any]:
        """Every field, steps included, as plain JSON values (for archives and exports)."""
        return asdict(self, dict_factory=_plain_dict)


def _plain_dict(items: list[tuple[str, Any]]) -> dict[str, Any]:
    """``asdict``'s dict factory: enums as their values, tuples as lists."""
    return {key: _plain(value) for key, value in items}


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, History):
        return [entry_dict(e) for e in value]
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class SagaHistory:
    """What ``sagas.history(saga_id)`` returns: a saga's history entries, oldest first, and
    how many older ones the bound folded away; iterating it yields the entries."""

    saga_id: str
    entries: tuple[HistoryEntry, ...]
    folded: int = 0

    def __iter__(self) -> Iterator[HistoryEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def to_dict(self) -> dict[str, Any]:
        """The history as plain JSON values (``celery sagas history --json``)."""
        return {"saga_id": self.saga_id, "folded": self.folded,
                "entries": [entry_dict(e) for e in self.entries]}


def entry_dict(entry: HistoryEntry) -> dict[str, Any]:
    """A history entry as plain JSON values, its None fields left out."""
    return {name: str(value) if name == "event" else value
            for name, value in asdict(entry).items() if value is not None}


@dataclass(frozen=True, slots=True)
class OperatorAction:
    """Who did what to a saga, and why: the history entry an operator's write appends."""

    event: HistoryEvent
    actor: str | None = None
    reason: str | None = None
    step: str | None = None
    state: str | None = None
    code: str | None = None
    ref: str | None = None

    def entry(self, at_ms: int) -> HistoryEntry:
        """The action as the history entry written at ``at_ms``."""
        return HistoryEntry(at_ms, self.event, self.step, None, self.state, self.code, self.ref,
                            None, self.actor, self.reason)


@dataclass(frozen=True, slots=True)
class ParentRef:
    """Which saga, and which of its steps, a child saga reports to (docs/design.md §3.7)."""

    saga_id: str
    step: str


@dataclass(frozen=True, slots=True)
class SignalRecord:
    """A signal sent to a saga (docs/design.md §3.5): ``sagas.signal`` records it once per
    ``signal_id``; a ``ctx.wait_signal`` of its name consumes it.

    Attributes:
        signal_id: the id that makes a repeated send one signal.
        name: the signal's name, as ``ctx.wait_signal(name)`` asks for it.
        payload: the JSON value sent with it.
        sent_at_ms: when it was recorded (ms since the epoch).
        consumed_by: the name of the waiting step that received it, or None while unconsumed.
    """

    signal_id: str
    name: str
    payload: Any
    sent_at_ms: int
    consumed_by: str | None = None


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """One attempt to cause a side effect, as its step's mark says (docs/design.md §2.3); no payloads."""

    effect_id: str
    capability: str
    state: EffectState
    created_at_ms: int
    updated_at_ms: int
    version: int = 1
    target: str | None = None
    digest: str | None = None
    tenant_id: str | None = None
    principal_id: str | None = None
    error_code: str | None = None
    saga_id: str | None = None
    step: str | None = None
    stage: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """A human approval gate; stores only the SHA-256 of the resume token (docs/design.md §2.4)."""

    approval_id: str
    effect_id: str
    capability: str
    tenant_id: str
    principal_id: str
    token_hash: str = field(repr=False)
    state: ApprovalState
    created_at_ms: int
    expires_at_ms: int
    updated_at_ms: int
    version: int = 1
    target: str | None = None
    digest: str | None = None
    decided_by: str | None = None
    saga_id: str | None = None
    step: str | None = None
    nonce: str | None = field(default=None, repr=False)

    @property
    def binding(self) -> Binding:
        """What the approval was granted for."""
        return Binding(self.capability, self.tenant_id, self.principal_id, self.target, self.digest)


@dataclass(frozen=True, slots=True)
class AttemptRef:
    """Which attempt of which effect of a step a move is about (a late or duplicate report of
    an older attempt must not move a newer one)."""

    step: str
    effect_id: str
    attempt: int

    @classmethod
    def execution(cls, step: StepRecord) -> AttemptRef:
        """The current attempt of a step's execution."""
        return cls(step.name, step.effect_id, step.attempts)

    @classmethod
    def compensation(cls, step: StepRecord) -> AttemptRef:
        """The current attempt of a step's compensation."""
        return cls(step.name, step.compensation_effect_id, step.compensation_attempts)


@dataclass(frozen=True, slots=True)
class Binding:
    """What an approval is for: a capability, the tenant and principal asking, and optionally
    the target and a digest of the exact request."""

    capability: str
    tenant_id: str
    principal_id: str
    target: str | None = None
    digest: str | None = None

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Binding:
        """The binding recorded in a gate step's keyword arguments."""
        return cls(values["capability"], values["tenant_id"], values["principal_id"],
                   values.get("target"), values.get("digest"))
