"""Every error celery_sagas raises, under one root.

    SagaError
    ├── SagaValidationError (ValueError)     bad input; nothing was written
    │   └── PayloadTooLarge                  a JSON payload over the size limit
    ├── InvalidRecordError                   the store returned a corrupt record
    ├── UndecryptableRecord                  a record's payloads need a key not configured
    ├── IllegalTransition                    a protocol move the design forbids
    ├── StoreError                           a store driver failed (translated)
    │   ├── StoreUnavailable                 a store's extra is missing or the URL is unknown
    │   ├── NonDurableStoreError             a store that keeps nothing, or Redis without AOF
    │   └── FencedWriteRefused               a write under an older lease grant
    ├── SagaConcurrencyError                 lost a compare-and-set race
    ├── SagaNotFound (LookupError)           no saga with that id
    ├── SagaConflictError                    start() reused an id for other input
    ├── SagaAlreadyFinal                     a signal sent to a completed or compensated saga
    ├── SignalLimitExceeded                  a signal past sagas_signal_limit or _bytes_limit
    ├── SagaResolutionError                  resolve() asked for an impossible outcome
    ├── SagaConfigurationError               a definition or setting is unusable
    ├── SagaUsageError                       a saga task used outside a saga (called directly)
    ├── StepTimeLimitExceeded                an inline-capable step's body ran past its time limit
    ├── StepNotCommitted                     raised by step code: provably nothing happened
    │   ├── SignalTimeout                    ctx.wait_signal saw no signal within its timeout
    │   └── StepFailed                       raised in run by ctx.step: the step did not commit
    ├── LeaseError                           a lease operation failed
    │   └── LeaseLost                        renewal failed: stop at once
    └── ApprovalError
        ├── ApprovalRequired                 a gate needs a human decision (token hidden)
        ├── ApprovalTokenInvalid
        ├── ApprovalTokenExpired
        ├── ApprovalTokenReplay
        ├── ApprovalBindingError
        ├── ApprovalPending
        ├── ApprovalDenied
        └── ApprovalDecisionError            decide() on a non-pending approval

Every error keeps its constructor arguments as attributes and pickles through them, so
errors survive a Celery task boundary. Secrets never appear in ``str`` or ``repr``.

``NondeterminismError`` and ``SagaAmbiguousStepError`` were never raised (a replay that diverges
and a step whose outcome is unknown send the saga to review, codes ``nondeterministic`` and
``ambiguous_step``); importing them still works, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, ClassVar

__all__ = [
    "ApprovalBindingError",
    "ApprovalDecisionError",
    "ApprovalDenied",
    "ApprovalError",
    "ApprovalPending",
    "ApprovalRequired",
    "ApprovalTokenExpired",
    "ApprovalTokenInvalid",
    "ApprovalTokenReplay",
    "FencedWriteRefused",
    "IllegalTransition",
    "InvalidRecordError",
    "LeaseError",
    "LeaseLost",
    "NonDurableStoreError",
    "PayloadTooLarge",
    "SagaAlreadyFinal",
    "SagaConcurrencyError",
    "SagaConfigurationError",
    "SagaConflictError",
    "SagaError",
    "SagaNotFound",
    "SagaResolutionError",
    "SagaUsageError",
    "SagaValidationError",
    "SignalLimitExceeded",
    "SignalTimeout",
    "StepFailed",
    "StepNotCommitted",
    "StepTimeLimitExceeded",
    "StoreError",
    "StoreUnavailable",
    "UndecryptableRecord",
]

# Error codes are kept as written: a business code (``INSUFFICIENT_CREDIT``) or ours (``not_committed``).
ERROR_CODE_RULE = "[A-Za-z][A-Za-z0-9_.-]{0,63}"


def _rebuild(cls: type[SagaError], fields: dict[str, Any]) -> SagaError:
    return cls(**fields)


class SagaError(Exception):
    """Root of every celery_sagas error."""

    fields: ClassVar[tuple[str, ...]] = ("message",)
    hidden: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, message: str = "", **fields: Any) -> None:
        self._fields = {"message": message, **fields}
        for name, value in fields.items():
            setattr(self, name, value)
        super().__init__(message or self.render())

    def render(self) -> str:
        """Build the message from the fields when none was given."""
        return type(self).__name__

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), dict(self._fields)))

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{k}={v!r}" for k, v in self._fields.items() if k not in self.hidden and v
        )
        return f"{type(self).__name__}({shown})"


class SagaValidationError(SagaError, ValueError):
    """Input broke a value rule (docs/design.md §2.5); nothing was written."""


class PayloadTooLarge(SagaValidationError):
    """A JSON payload is larger than the configured limit."""


class InvalidRecordError(SagaError):
    """The store returned an invalid record (corrupt, mismatched or unknown state)."""

    kind: str
    record_id: str

    def __init__(self, message: str = "", *, kind: str = "", record_id: str = "") -> None:
        super().__init__(message, kind=kind, record_id=record_id)

    def render(self) -> str:
        return f"store returned an invalid record ({self._fields['kind']} {self._fields['record_id']!r})"


class UndecryptableRecord(SagaError):
    """A record's payloads were encrypted with a key ``encryption_keys`` no longer lists (or
    this process has none): it is intact, never treated as corrupt, and nothing acts on it."""

    kind: str
    record_id: str

    def __init__(self, message: str = "", *, kind: str = "", record_id: str = "") -> None:
        super().__init__(message, kind=kind, record_id=record_id)

    def render(self) -> str:
        return (f"{self._fields['kind']} {self._fields['record_id']!r} was encrypted with a key "
                "not in encryption_keys")


class IllegalTransition(SagaError):
    """A protocol move docs/design.md §2.2 does not allow; the input record is unchanged."""

    state: str
    event: str

    def __init__(self, message: str = "", *, state: str = "", event: str = "") -> None:
        super().__init__(message, state=state, event=event)

    def render(self) -> str:
        return f"illegal transition: {self._fields['event']} from {self._fields['state']}"


class StoreError(SagaError):
    """A store operation failed; the driver error is the ``__cause__``."""


class StoreUnavailable(StoreError):
    """The store cannot be opened: unknown scheme or a missing extra."""


class NonDurableStoreError(StoreError):
    """A store that keeps nothing without allow_non_durable, or a Redis without AOF."""


class FencedWriteRefused(StoreError):
    """A write carried a lease fencing number older than the newest grant."""

    lease: str
    fence: int

    def __init__(self, message: str = "", *, lease: str = "", fence: int = 0) -> None:
        super().__init__(message, lease=lease, fence=fence)

    def render(self) -> str:
        lease, fence = self._fields["lease"], self._fields["fence"]
        return f"write under lease {lease!r} fence {fence} refused: a newer grant exists"


class SagaConcurrencyError(SagaError):
    """Another writer changed the record first (lost compare-and-set)."""


class SagaNotFound(SagaError, LookupError):
    """No saga record has that id."""

    saga_id: str

    def __init__(self, message: str = "", *, saga_id: str = "") -> None:
        super().__init__(message, saga_id=saga_id)

    def render(self) -> str:
        return f"no saga {self._fields['saga_id']!r}"


class SagaConflictError(SagaError):
    """start() reused a saga id with another definition or input."""

    saga_id: str

    def __init__(self, message: str = "", *, saga_id: str = "") -> None:
        super().__init__(message, saga_id=saga_id)

    def render(self) -> str:
        return f"saga {self._fields['saga_id']!r} exists with another definition or input"


class SagaAlreadyFinal(SagaError):
    """A signal was sent to a saga that is completed or compensated: no wait can receive it,
    so it is refused (nothing is written); a repeat of a signal it already holds is not."""

    saga_id: str
    state: str

    def __init__(self, message: str = "", *, saga_id: str = "", state: str = "") -> None:
        super().__init__(message, saga_id=saga_id, state=state)

    def render(self) -> str:
        f = self._fields
        return f"saga {f['saga_id']!r} is {f['state']}: it takes no more signals (signal refused)"


class SignalLimitExceeded(SagaError):
    """A saga holds as many unconsumed signals (or bytes of them) as a setting allows: the
    signal is refused before anything is written."""

    saga_id: str
    setting: str
    limit: int
    held: int

    def __init__(self, message: str = "", *, saga_id: str = "", setting: str = "",
                 limit: int = 0, held: int = 0) -> None:
        super().__init__(message, saga_id=saga_id, setting=setting, limit=limit, held=held)

    def render(self) -> str:
        f = self._fields
        unit = "bytes of " if f["setting"].endswith("bytes_limit") else ""
        return (f"saga {f['saga_id']!r} holds {f['held']} {unit}unconsumed signals; one more "
                f"would pass {f['setting']} ({f['limit']}): signal refused, nothing written")


class _SagaAmbiguousStepError(SagaError):
    """Deprecated, never raised: a step whose outcome is unknown sends its saga to review."""

    saga_id: str
    step: str
    effect_id: str

    def __init__(
        self, message: str = "", *, saga_id: str = "", step: str = "", effect_id: str = ""
    ) -> None:
        super().__init__(message, saga_id=saga_id, step=step, effect_id=effect_id)

    def render(self) -> str:
        f = self._fields
        return f"saga {f['saga_id']!r} step {f['step']!r} effect {f['effect_id']!r} is ambiguous"


class SagaResolutionError(SagaError):
    """resolve() named an unknown step, a wrong effect id, state or outcome."""


class _NondeterminismError(SagaError):
    """Deprecated, never raised: a replay that diverges sends its saga to review."""


_DEPRECATED: dict[str, type[SagaError]] = {
    "NondeterminismError": _NondeterminismError,
    "SagaAmbiguousStepError": _SagaAmbiguousStepError,
}


def __getattr__(name: str) -> type[SagaError]:
    """The errors removed from the public surface (never raised), with a warning."""
    if name in _DEPRECATED:
        warnings.warn(
            f"celery_sagas.errors.{name} is never raised and will be removed: a saga whose "
            "replay diverges or whose step outcome is unknown goes to manual review (error "
            "codes 'nondeterministic', 'ambiguous_step')",
            DeprecationWarning,
            stacklevel=2,
        )
        return _DEPRECATED[name]
    raise AttributeError(f"module 'celery_sagas.errors' has no attribute {name!r}")


class SagaConfigurationError(SagaError):
    """A saga definition or a Celery setting cannot be used safely."""


class SagaUsageError(SagaError):
    """A step or compensator task was used outside a saga: called directly, or sent with
    ``.delay()``/``.apply_async()`` (its body never runs without a claim and an effect id)."""


class StepTimeLimitExceeded(SagaError):
    """Raised inside a step body of an inline saga that ran past the step's own time limit
    (docs/performance.md): like Celery's soft limit; the step's outcome is unknown (code
    ``time_limit``)."""

    seconds: float

    def __init__(self, seconds: float = 0.0, message: str = "") -> None:
        super().__init__(message, seconds=seconds)

    def render(self) -> str:
        return f"the step ran past its time limit of {self._fields['seconds']:g}s"


class StepNotCommitted(SagaError):
    """Raised by step code when the provider proved nothing was committed.

    ``code`` is stored as given (``INSUFFICIENT_CREDIT``, ``card.declined``); one that does not
    match ``[A-Za-z][A-Za-z0-9_.-]{0,63}`` raises SagaValidationError here, where it is written.
    """

    code: str

    def __init__(self, code: str = "not_committed", message: str = "") -> None:
        if not isinstance(code, str) or not re.fullmatch(ERROR_CODE_RULE, code):
            raise SagaValidationError(f"error code must match {ERROR_CODE_RULE}: {str(code)[:80]!r}")
        super().__init__(message, code=code)

    def render(self) -> str:
        return f"step not committed: {self._fields['code']}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._fields["code"], self._fields["message"]))


class SignalTimeout(StepNotCommitted):
    """``ctx.wait_signal(name, timeout)`` saw no signal ``name`` within ``timeout`` seconds.

    ``run`` may catch it to take another path; left uncaught it rolls the saga back (code
    ``signal_timeout``), like any step that did not commit.
    """

    signal: str

    def __init__(self, signal: str = "", message: str = "") -> None:
        SagaError.__init__(self, message, code="signal_timeout", signal=signal)

    def render(self) -> str:
        return f"no signal {self._fields['signal']!r} within the timeout"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._fields["signal"], self._fields["message"]))


class StepFailed(StepNotCommitted):
    """Raised **in run** by ``ctx.step(...)`` for a step that failed with a known outcome
    (``StepNotCommitted``, a ``not_committed_on`` type, an exhausted ``retry_on``).

    ``step`` is the step's name, ``code`` its error code, ``message`` the type and message of
    what its body raised. ``run`` may catch it and go on (later steps, another provider, or
    a normal return: completed), the same way on every replay; uncaught, the saga compensates
    with the step's code, as before.
    """

    step: str
    # What the body raised is your code's text: kept out of str() and repr() (and so of logs).
    hidden: ClassVar[frozenset[str]] = frozenset({"detail"})

    def __init__(self, step: str = "", code: str = "not_committed", message: str = "") -> None:
        StepNotCommitted(code)  # the code rule, checked where the error is made
        SagaError.__init__(self, "", code=code, step=step, detail=message)

    @property
    def message(self) -> str:
        """The type and message of what the step's body raised (``"CardDeclined: ..."``)."""
        return str(self._fields["detail"])

    def render(self) -> str:
        return f"step {self._fields['step']!r} did not commit ({self._fields['code']})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._fields["step"], self._fields["code"], self._fields["detail"]))


class LeaseError(SagaError):
    """A lease could not be used as asked."""


class LeaseLost(LeaseError):
    """The lease expired or was taken over; the holder must stop at once."""


class ApprovalError(SagaError):
    """Root of the approval errors."""


class ApprovalRequired(ApprovalError):
    """A gated step needs a human decision; carries the resume token (never shown)."""

    approval_id: str
    effect_id: str
    expires_at_ms: int
    token: str

    hidden: ClassVar[frozenset[str]] = frozenset({"token"})

    def __init__(
        self,
        message: str = "",
        *,
        approval_id: str = "",
        effect_id: str = "",
        expires_at_ms: int = 0,
        token: str = "",
    ) -> None:
        super().__init__(
            message,
            approval_id=approval_id,
            effect_id=effect_id,
            expires_at_ms=expires_at_ms,
            token=token,
        )

    def render(self) -> str:
        return f"approval {self._fields['approval_id']!r} required"


class ApprovalTokenInvalid(ApprovalError):
    """The token is malformed, too long, or its signature does not verify."""


class ApprovalTokenExpired(ApprovalError):
    """The token or its approval is past its expiry."""


class ApprovalTokenReplay(ApprovalError):
    """The approval was already consumed."""


class ApprovalBindingError(ApprovalError):
    """The token belongs to another tenant, principal, capability, target or digest."""


class ApprovalPending(ApprovalError):
    """Nobody has decided the approval yet."""


class ApprovalDenied(ApprovalError):
    """The approval was denied."""


class ApprovalDecisionError(ApprovalError):
    """Only a pending, unexpired approval of the same tenant can be decided, once."""
