"""Frozen records, their states and the value objects moves take (docs/design.md §2).

The model imports no storage: how a record becomes an envelope (and back, with read
validation) is ``_codec.py``'s business.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = [
    "APPROVAL",
    "APPROVAL_TASK",
    "SAGA",
    "ApprovalRecord",
    "ApprovalState",
    "AttemptRef",
    "Binding",
    "EffectMark",
    "EffectRecord",
    "EffectState",
    "SagaRecord",
    "SagaState",
    "StepRecord",
    "StepState",
    "TextEnum",
]

SAGA = "saga"
APPROVAL = "approval"

# The task name recorded for approval gates: steps no task runs.
APPROVAL_TASK = "celery_sagas.approval"


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
    and the error code that failed it; kept in the step, written with the saga record."""

    state: EffectState
    at_ms: int
    attempt: int = 0
    error_code: str | None = None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of a saga: its effect ids, state, arguments, result and attempt counters."""

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
    execution: EffectMark | None = None
    compensation: EffectMark | None = None


@dataclass(frozen=True, slots=True)
class SagaRecord:
    """A saga: definition, state, input and the ordered steps recorded so far."""

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

    def step(self, name: str) -> StepRecord | None:
        """The step record with this name, or None."""
        for step in self.steps:
            if step.name == name:
                return step
        return None


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

    def as_dict(self) -> dict[str, str | None]:
        """The binding as a gate step records it."""
        return {"capability": self.capability, "tenant_id": self.tenant_id,
                "principal_id": self.principal_id, "target": self.target, "digest": self.digest}
