"""Frozen records, their states, and their JSON form with read validation (SPEC §1, §2).

A record travels to a store as an ``Envelope``: version, state and updated_at_ms ride in the
envelope (the store indexes them), everything else in a JSON body. Decoding validates what
came back; anything off raises ``InvalidRecordError`` and is never acted on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from . import _values as values
from .errors import InvalidRecordError, SagaValidationError
from .stores.base import Envelope

__all__ = [
    "ApprovalRecord",
    "ApprovalState",
    "EffectRecord",
    "EffectState",
    "SagaRecord",
    "SagaState",
    "StepRecord",
    "StepState",
    "approval_from_envelope",
    "approval_to_envelope",
    "effect_from_envelope",
    "effect_to_envelope",
    "saga_from_envelope",
    "saga_to_envelope",
]

SAGA = "saga"
EFFECT = "effect"
APPROVAL = "approval"


class _State(str, Enum):
    def __str__(self) -> str:
        return str(self.value)


class SagaState(_State):
    """Saga states (SPEC §2.2)."""

    RUNNING = "running"
    COMPENSATING = "compensating"
    COMPLETED = "completed"
    COMPENSATED = "compensated"
    MANUAL_REVIEW = "manual-review"

    @property
    def final(self) -> bool:
        """True for states no transition leaves."""
        return self in (SagaState.COMPLETED, SagaState.COMPENSATED)


class StepState(_State):
    """Step states (SPEC §2.2)."""

    EXECUTING = "executing"
    AWAITING_APPROVAL = "awaiting-approval"
    COMMITTED = "committed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"
    COMPENSATING = "compensating"
    COMPENSATION_FAILED = "compensation-failed"
    COMPENSATED = "compensated"


class EffectState(_State):
    """Effect journal states (SPEC §2.1)."""

    ADMISSION = "admission"
    EXECUTING = "executing"
    COMMITTED = "committed"
    FAILED = "failed"
    UNKNOWN = "unknown"


class ApprovalState(_State):
    """Approval states (SPEC §2.3)."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    CONSUMED = "consumed"
    EXPIRED = "expired"


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
    """One journaled attempt to cause a side effect (SPEC §2.1); never carries payloads."""

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
    """A human approval gate; stores only the SHA-256 of the resume token (SPEC §2.3)."""

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


# ---------------------------------------------------------------- encoding


def _envelope(kind: str, record_id: str, record: Any, body: dict[str, Any], limit: int) -> Envelope:
    text = values.encode_json(body, field=f"{kind} record", limit=limit)
    return Envelope(kind, record_id, record.version, str(record.state), record.updated_at_ms, text)


def _step_body(step: StepRecord) -> dict[str, Any]:
    body = {
        "name": step.name,
        "task": step.task,
        "effect_id": step.effect_id,
        "compensation_effect_id": step.compensation_effect_id,
        "state": str(step.state),
        "args": list(step.args),
        "kwargs": dict(step.kwargs),
        "compensator": step.compensator,
        "result": step.result,
        "attempts": step.attempts,
        "compensation_attempts": step.compensation_attempts,
        "next_attempt_at_ms": step.next_attempt_at_ms,
        "started_at_ms": step.started_at_ms,
        "claimed_by": step.claimed_by,
        "dispatched_at_ms": step.dispatched_at_ms,
        "time_limit_ms": step.time_limit_ms,
        "committed_at_ms": step.committed_at_ms,
        "error_code": step.error_code,
        "approval_id": step.approval_id,
        "group": step.group,
    }
    return {k: v for k, v in body.items() if v is not None}


def saga_to_envelope(record: SagaRecord, *, limit: int = values.DEFAULT_PAYLOAD_LIMIT) -> Envelope:
    """Encode a saga record; refuses non-JSON payloads and bodies over ``limit`` bytes."""
    body = {
        "definition": record.definition,
        "input": record.input,
        "created_at_ms": record.created_at_ms,
        "steps": [_step_body(step) for step in record.steps],
        "error_code": record.error_code,
        "reason": record.reason,
        "rolling_back": record.rolling_back,
    }
    return _envelope(SAGA, record.saga_id, record, body, limit)


def effect_to_envelope(record: EffectRecord) -> Envelope:
    """Encode an effect record."""
    body = {
        "capability": record.capability,
        "created_at_ms": record.created_at_ms,
        "target": record.target,
        "digest": record.digest,
        "tenant_id": record.tenant_id,
        "principal_id": record.principal_id,
        "error_code": record.error_code,
        "saga_id": record.saga_id,
        "step": record.step,
        "stage": record.stage,
    }
    return _envelope(EFFECT, record.effect_id, record, body, values.DEFAULT_PAYLOAD_LIMIT)


def approval_to_envelope(record: ApprovalRecord) -> Envelope:
    """Encode an approval record (the token hash, never the token)."""
    body = {
        "effect_id": record.effect_id,
        "capability": record.capability,
        "tenant_id": record.tenant_id,
        "principal_id": record.principal_id,
        "token_hash": record.token_hash,
        "created_at_ms": record.created_at_ms,
        "expires_at_ms": record.expires_at_ms,
        "target": record.target,
        "digest": record.digest,
        "decided_by": record.decided_by,
        "saga_id": record.saga_id,
        "step": record.step,
        "nonce": record.nonce,
    }
    return _envelope(APPROVAL, record.approval_id, record, body, values.DEFAULT_PAYLOAD_LIMIT)


# ---------------------------------------------------------------- decoding


class _Body:
    """Typed accessors over a decoded body; any mismatch is an invalid record."""

    def __init__(self, raw: Mapping[str, Any], fail: InvalidRecordError) -> None:
        self.raw = raw
        self.fail = fail

    def need(self, key: str, kind: type) -> Any:
        value = self.raw.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail
        return value

    def maybe(self, key: str, kind: type) -> Any:
        return None if self.raw.get(key) is None else self.need(key, kind)


def _open(envelope: Envelope | None, kind: str, record_id: str) -> tuple[_Body, InvalidRecordError]:
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
    if not isinstance(raw, dict):
        raise fail
    body = _Body(raw, fail)
    created = body.need("created_at_ms", int)
    if not 0 <= created <= envelope.updated_at_ms:
        raise fail
    return body, fail


def _state(enum: type[Any], value: str, fail: InvalidRecordError) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise fail from None


def _checked(fail: InvalidRecordError, check: Any, value: Any) -> Any:
    if value is None:
        return None
    try:
        return check(value)
    except SagaValidationError:
        raise fail from None


def _step(raw: Any, fail: InvalidRecordError) -> StepRecord:
    if not isinstance(raw, dict):
        raise fail
    body = _Body(raw, fail)
    return StepRecord(
        name=_checked(fail, values.step_name, body.need("name", str)),
        task=body.need("task", str),
        effect_id=_checked(fail, values.effect_id, body.need("effect_id", str)),
        compensation_effect_id=_checked(
            fail, values.effect_id, body.need("compensation_effect_id", str)
        ),
        state=_state(StepState, body.need("state", str), fail),
        args=tuple(body.need("args", list)),
        kwargs=body.need("kwargs", dict),
        compensator=body.maybe("compensator", str),
        result=raw.get("result"),
        attempts=body.need("attempts", int),
        compensation_attempts=body.need("compensation_attempts", int),
        next_attempt_at_ms=body.maybe("next_attempt_at_ms", int),
        started_at_ms=body.maybe("started_at_ms", int),
        claimed_by=body.maybe("claimed_by", str),
        dispatched_at_ms=body.maybe("dispatched_at_ms", int),
        time_limit_ms=body.maybe("time_limit_ms", int),
        committed_at_ms=body.maybe("committed_at_ms", int),
        error_code=body.maybe("error_code", str),
        approval_id=body.maybe("approval_id", str),
        group=body.maybe("group", str),
    )


def saga_from_envelope(envelope: Envelope | None, saga_id: str) -> SagaRecord:
    """Decode and validate a saga record read for ``saga_id``."""
    body, fail = _open(envelope, SAGA, saga_id)
    assert envelope is not None
    steps = tuple(_step(raw, fail) for raw in body.need("steps", list))
    names = [s.name for s in steps]
    effect_ids = [e for s in steps for e in (s.effect_id, s.compensation_effect_id)]
    if len(set(names)) != len(names) or len(set(effect_ids)) != len(effect_ids):
        raise fail
    return SagaRecord(
        saga_id=saga_id,
        definition=_checked(fail, values.definition_name, body.need("definition", str)),
        state=_state(SagaState, envelope.state, fail),
        input=body.raw.get("input"),
        created_at_ms=body.need("created_at_ms", int),
        updated_at_ms=envelope.updated_at_ms,
        steps=steps,
        version=envelope.version,
        error_code=body.maybe("error_code", str),
        reason=body.maybe("reason", str),
        rolling_back=bool(body.maybe("rolling_back", bool)),
    )


def _identity(body: _Body, fail: InvalidRecordError, *, required: bool) -> tuple[Any, Any]:
    tenant = _checked(fail, values.tenant_id, body.maybe("tenant_id", str))
    principal = _checked(fail, values.principal_id, body.maybe("principal_id", str))
    if (tenant is None) != (principal is None) or (required and tenant is None):
        raise fail
    return tenant, principal


def effect_from_envelope(envelope: Envelope | None, effect_id: str) -> EffectRecord:
    """Decode and validate an effect record read for ``effect_id``."""
    body, fail = _open(envelope, EFFECT, effect_id)
    assert envelope is not None
    tenant, principal = _identity(body, fail, required=False)
    return EffectRecord(
        effect_id=effect_id,
        capability=_checked(fail, values.capability, body.need("capability", str)),
        state=_state(EffectState, envelope.state, fail),
        created_at_ms=body.need("created_at_ms", int),
        updated_at_ms=envelope.updated_at_ms,
        version=envelope.version,
        target=_checked(fail, values.target, body.maybe("target", str)),
        digest=_checked(fail, values.digest, body.maybe("digest", str)),
        tenant_id=tenant,
        principal_id=principal,
        error_code=body.maybe("error_code", str),
        saga_id=body.maybe("saga_id", str),
        step=body.maybe("step", str),
        stage=body.maybe("stage", str),
    )


def approval_from_envelope(envelope: Envelope | None, approval_id: str) -> ApprovalRecord:
    """Decode and validate an approval record read for ``approval_id``."""
    body, fail = _open(envelope, APPROVAL, approval_id)
    assert envelope is not None
    tenant, principal = _identity(body, fail, required=True)
    return ApprovalRecord(
        approval_id=approval_id,
        effect_id=_checked(fail, values.effect_id, body.need("effect_id", str)),
        capability=_checked(fail, values.capability, body.need("capability", str)),
        tenant_id=tenant,
        principal_id=principal,
        token_hash=_checked(fail, values.digest, body.need("token_hash", str)),
        state=_state(ApprovalState, envelope.state, fail),
        created_at_ms=body.need("created_at_ms", int),
        expires_at_ms=body.need("expires_at_ms", int),
        updated_at_ms=envelope.updated_at_ms,
        version=envelope.version,
        target=_checked(fail, values.target, body.maybe("target", str)),
        digest=_checked(fail, values.digest, body.maybe("digest", str)),
        decided_by=_checked(fail, _decider, body.maybe("decided_by", str)),
        saga_id=_checked(fail, values.saga_id, body.maybe("saga_id", str)),
        step=_checked(fail, values.step_name, body.maybe("step", str)),
        nonce=_checked(fail, values.nonce, body.maybe("nonce", str)),
    )


def _decider(value: object) -> str:
    return values.principal_id(value, field="decided by")
