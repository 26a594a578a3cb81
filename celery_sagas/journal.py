"""The effect journal: one durable record per attempt to cause a side effect (SPEC §2.1).

Every effect is admitted before it may begin, so a crash at any point leaves a record that
says how far it got: ``admission`` (never began), ``executing`` (began), ``committed`` /
``failed`` (known outcome) or ``unknown`` (began, outcome lost). The legal moves are the table
in ``protocol.effect``; each move here is one compare-and-set naming the version (and, through
the table, the state) it was judged on, so a lost race raises ``SagaConcurrencyError`` instead
of overwriting, and an illegal move raises ``IllegalTransition`` and writes nothing.

Effect records carry ids, capability, binding and state only, never payloads.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace

from . import values
from .clock import Clock, now_ms
from .errors import (
    NonDurableStoreError,
    SagaConcurrencyError,
    SagaConflictError,
    SagaNotFound,
    SagaValidationError,
)
from .protocol.effect import transition_effect
from .records import EFFECT, EffectRecord, EffectState, effect_from_envelope, effect_to_envelope
from .stores.base import Envelope, Store

__all__ = ["STAGES", "EffectJournal", "unique_write"]

STAGES = frozenset({"execution", "compensation", "reconciliation"})


@dataclass(frozen=True, slots=True)
class _Identity:
    """What makes two admissions of one effect id the same effect."""

    capability: str
    target: str | None
    digest: str | None
    tenant_id: str | None
    principal_id: str | None
    saga_id: str | None
    step: str | None
    stage: str | None

    @classmethod
    def of(cls, record: EffectRecord) -> _Identity:
        return cls(
            record.capability,
            record.target,
            record.digest,
            record.tenant_id,
            record.principal_id,
            record.saga_id,
            record.step,
            record.stage,
        )


def _optional(check: Callable[[object], str], value: object) -> str | None:
    return None if value is None else check(value)


def _identity(
    capability: str,
    target: str | None,
    digest: str | None,
    tenant_id: str | None,
    principal_id: str | None,
    saga_id: str | None,
    step: str | None,
    stage: str | None,
) -> _Identity:
    """Validate every admission value (SPEC §1) before anything is written."""
    if (tenant_id is None) != (principal_id is None):
        raise SagaValidationError("tenant id and principal id go together: both or neither")
    if stage is not None and stage not in STAGES:
        raise SagaValidationError(f"stage must be one of {sorted(STAGES)}, got {stage!r}")
    return _Identity(
        values.capability(capability),
        _optional(values.target, target),
        _optional(values.digest, digest),
        _optional(values.tenant_id, tenant_id),
        _optional(values.principal_id, principal_id),
        _optional(values.saga_id, saga_id),
        _optional(values.step_name, step),
        stage,
    )


def unique_write(envelope: Envelope) -> Envelope:
    """Add a fresh random ``write_id`` to the body so no two writers send the same record.

    A store reports a compare-and-set whose exact record is already stored as applied, so a
    driver retry is harmless; two writers that computed the same next record from the same
    version would otherwise both be told they won. Decoders ignore the extra key.
    """
    body = values.decode_json(envelope.body)
    body["write_id"] = secrets.token_hex(8)
    return replace(envelope, body=values.encode_json(body, field=f"{envelope.kind} record"))


class EffectJournal:
    """Admit effects and move them through their states with compare-and-set writes."""

    def __init__(self, store: Store, clock: Clock, *, allow_non_durable: bool = False) -> None:
        if getattr(store, "durable", False) is not True and not allow_non_durable:
            raise NonDurableStoreError(
                f"{type(store).__name__} is not durable; pass allow_non_durable=True for tests"
            )
        self.store = store
        self.clock = clock

    def admit(
        self,
        effect_id: str,
        capability: str,
        *,
        target: str | None = None,
        digest: str | None = None,
        tenant_id: str | None = None,
        principal_id: str | None = None,
        saga_id: str | None = None,
        step: str | None = None,
        stage: str | None = None,
    ) -> EffectRecord:
        """Record the effect in ``admission``; admitting the same effect again returns it."""
        values.effect_id(effect_id)
        wanted = _identity(capability, target, digest, tenant_id, principal_id, saga_id, step, stage)
        now = now_ms(self.clock)
        record = EffectRecord(
            effect_id=effect_id,
            capability=wanted.capability,
            state=EffectState.ADMISSION,
            created_at_ms=now,
            updated_at_ms=now,
            target=wanted.target,
            digest=wanted.digest,
            tenant_id=wanted.tenant_id,
            principal_id=wanted.principal_id,
            saga_id=wanted.saga_id,
            step=wanted.step,
            stage=wanted.stage,
        )
        if self.store.create(effect_to_envelope(record)):
            return record
        existing = self.get(effect_id)
        if existing is None or _Identity.of(existing) != wanted:
            raise SagaConflictError(f"effect {effect_id!r} was admitted with other values")
        return existing

    def get(self, effect_id: str) -> EffectRecord | None:
        """The effect record, or None; a corrupt record raises InvalidRecordError."""
        envelope = self.store.get(EFFECT, values.effect_id(effect_id))
        return None if envelope is None else effect_from_envelope(envelope, effect_id)

    def begin(self, effect_id: str) -> EffectRecord:
        """admission -> executing: the side effect is about to be attempted."""
        return self._move(effect_id, EffectState.EXECUTING, None)

    def commit(self, effect_id: str) -> EffectRecord:
        """executing (or unknown, once settled) -> committed."""
        return self._move(effect_id, EffectState.COMMITTED, None)

    def fail(self, effect_id: str, error_code: str) -> EffectRecord:
        """-> failed: the effect provably did not happen."""
        return self._move(effect_id, EffectState.FAILED, values.error_code(error_code))

    def mark_unknown(self, effect_id: str, error_code: str | None = None) -> EffectRecord:
        """executing -> unknown: it began and its outcome is not known."""
        code = None if error_code is None else values.error_code(error_code)
        return self._move(effect_id, EffectState.UNKNOWN, code)

    def _move(self, effect_id: str, to: EffectState, error_code: str | None) -> EffectRecord:
        current = self.get(effect_id)
        if current is None:
            raise SagaNotFound(f"no effect {effect_id!r}")
        moved = transition_effect(current, to, now_ms(self.clock), error_code)
        if not self.store.compare_and_set(unique_write(effect_to_envelope(moved)), current.version):
            raise SagaConcurrencyError(
                f"effect {effect_id!r} changed since version {current.version} ({current.state})"
            )
        return moved
