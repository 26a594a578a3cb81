"""The effect journal: one durable record per attempt to cause a side effect (SPEC §2.1).

Every effect is admitted before it may begin, so a crash at any point leaves a record that
says how far it got: ``admission`` (never began), ``executing`` (began), ``committed`` /
``failed`` (known outcome) or ``unknown`` (began, outcome lost). The legal moves are the table
in ``protocol.effect``; each move here is one compare-and-set naming the version (and, through
the table, the state) it was judged on, so a lost race raises ``SagaConcurrencyError`` instead
of overwriting, and an illegal move raises ``IllegalTransition`` and writes nothing.

Effect records carry ids, capability, binding and state only, never payloads.

In the engine (``EffectRecorder``) every step execution and every compensation is an effect,
keyed by its effect id, and each lifecycle point is one journal write:

    intent -> admission    executing -> executing    committed -> committed
    failed (for good) -> failed    ambiguous -> unknown

One effect id covers all the attempts made under it (idempotent retries, compensation
retries, a compensation resumed after review): a failure that will be retried writes
nothing, so the record stays ``executing``, and each new attempt refreshes its
``updated_at``. An operator's resolution settles ``unknown`` (or a compensation left
``executing``) as committed or failed. The saga record stays authoritative: a journal write
that keeps failing is logged and skipped, and the sweep reports the effect it left behind.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from . import _values as values
from ._clock import Clock, now_ms
from ._events import LifecycleEvent, Phase, effect_stage
from ._protocol import codes
from ._protocol.effect import FINAL_EFFECT_STATES, transition_effect
from ._records import (
    EFFECT,
    EffectRecord,
    EffectState,
    StepState,
    effect_from_envelope,
    effect_to_envelope,
)
from .errors import (
    IllegalTransition,
    NonDurableStoreError,
    PayloadTooLarge,
    SagaConcurrencyError,
    SagaConflictError,
    SagaError,
    SagaNotFound,
    SagaValidationError,
    StoreError,
)
from .stores.base import Envelope, Store

__all__ = ["STAGES", "EffectJournal", "EffectRecorder", "journal_target", "unique_write"]

logger = logging.getLogger("celery_sagas.journal")

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


def unique_write(envelope: Envelope, *, limit: int = values.DEFAULT_PAYLOAD_LIMIT) -> Envelope:
    """Add a fresh random ``write_id`` to the body so no two writers send the same record.

    A store reports a compare-and-set whose exact record is already stored as applied, so a
    driver retry is harmless; two writers that computed the same next record from the same
    version would otherwise both be told they won. Decoders ignore the extra key. The key is
    appended to the canonical JSON text (it sorts after every record key, so the body stays
    canonical) instead of decoding and encoding the body again; ``limit`` bounds the result.
    """
    body = envelope.body
    if not (body.startswith("{") and body.endswith("}")):
        raise SagaValidationError(f"{envelope.kind} record body is not a JSON object")
    separator = "" if body == "{}" else ","
    stamped = f'{body[:-1]}{separator}"write_id":"{secrets.token_hex(8)}"}}'
    if len(stamped) > limit and len(stamped.encode("utf-8")) > limit:
        raise PayloadTooLarge(f"{envelope.kind} record is over the {limit}-byte limit")
    return replace(envelope, body=stamped)


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
        record, wanted = self._admission(
            effect_id, capability, target, digest, tenant_id, principal_id, saga_id, step, stage
        )
        if self.store.create(effect_to_envelope(record)):
            return record
        existing = self.get(effect_id)
        if existing is None or _Identity.of(existing) != wanted:
            raise SagaConflictError(f"effect {effect_id!r} was admitted with other values")
        return existing

    def admit_new(
        self,
        effect_id: str,
        capability: str,
        *,
        saga_id: str | None = None,
        step: str | None = None,
        stage: str | None = None,
    ) -> EffectRecord | None:
        """Record the effect in ``admission`` with one write; None, without reading, when the
        effect id is already journaled (the hot path of the engine, which never reuses ids)."""
        record, _ = self._admission(effect_id, capability, None, None, None, None, saga_id, step, stage)
        return record if self.store.create(effect_to_envelope(record)) else None

    def _admission(
        self, effect_id: str, capability: str, target: str | None, digest: str | None,
        tenant_id: str | None, principal_id: str | None, saga_id: str | None, step: str | None,
        stage: str | None,
    ) -> tuple[EffectRecord, _Identity]:
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
        return record, wanted

    def get(self, effect_id: str) -> EffectRecord | None:
        """The effect record, or None; a corrupt record raises InvalidRecordError."""
        envelope = self.store.get(EFFECT, values.effect_id(effect_id))
        return None if envelope is None else effect_from_envelope(envelope, effect_id)

    # Each transition reads the record and compare-and-sets from it; a caller that holds the
    # record it last wrote or read passes it as ``known`` to skip the read. A stale ``known``
    # simply loses the compare-and-set (SagaConcurrencyError), like any lost race: read again
    # and judge again (EffectRecorder does).

    def begin(self, effect_id: str, *, known: EffectRecord | None = None) -> EffectRecord:
        """admission -> executing: the side effect is about to be attempted."""
        return self._move(effect_id, EffectState.EXECUTING, None, known)

    def commit(self, effect_id: str, *, known: EffectRecord | None = None) -> EffectRecord:
        """executing (or unknown, once settled) -> committed."""
        return self._move(effect_id, EffectState.COMMITTED, None, known)

    def fail(self, effect_id: str, error_code: str, *, known: EffectRecord | None = None) -> EffectRecord:
        """-> failed: the effect provably did not happen."""
        return self._move(effect_id, EffectState.FAILED, values.error_code(error_code), known)

    def mark_unknown(
        self, effect_id: str, error_code: str | None = None, *, known: EffectRecord | None = None
    ) -> EffectRecord:
        """executing -> unknown: it began and its outcome is not known."""
        code = None if error_code is None else values.error_code(error_code)
        return self._move(effect_id, EffectState.UNKNOWN, code, known)

    def touch(self, effect_id: str, *, known: EffectRecord | None = None) -> EffectRecord:
        """executing stays executing: another attempt under the same effect id began (an
        idempotent retry); only ``updated_at`` moves, so the attempt is not judged stale."""
        current = self._current(effect_id, known)
        if current.state is not EffectState.EXECUTING:
            raise IllegalTransition(state=str(current.state), event="touch")
        moved = replace(
            current, version=current.version + 1,
            updated_at_ms=max(now_ms(self.clock), current.updated_at_ms),
        )
        return self._write(moved, current)

    def _current(self, effect_id: str, known: EffectRecord | None) -> EffectRecord:
        if known is not None:
            if known.effect_id != effect_id:
                raise SagaValidationError(f"known record is effect {known.effect_id!r}, not {effect_id!r}")
            return known
        current = self.get(effect_id)
        if current is None:
            raise SagaNotFound(f"no effect {effect_id!r}")
        return current

    def _move(self, effect_id: str, to: EffectState, error_code: str | None,
              known: EffectRecord | None) -> EffectRecord:
        current = self._current(effect_id, known)
        return self._write(transition_effect(current, to, now_ms(self.clock), error_code), current)

    def _write(self, moved: EffectRecord, current: EffectRecord) -> EffectRecord:
        if not self.store.compare_and_set(unique_write(effect_to_envelope(moved)), current.version):
            raise SagaConcurrencyError(
                f"effect {moved.effect_id!r} changed since version {current.version} ({current.state})"
            )
        return moved


# ------------------------------------------------------------------ the engine's recorder

_A, _X, _C = EffectState.ADMISSION, EffectState.EXECUTING, EffectState.COMMITTED
_F, _U = EffectState.FAILED, EffectState.UNKNOWN

# The writes that bring a journaled effect from its state to the one the saga record implies
# (executing -> executing is a touch). A pair not listed writes nothing: the record is there
# already, or past it (a late or duplicate report never moves a settled effect back).
_PATHS: dict[tuple[EffectState, EffectState], tuple[EffectState, ...]] = {
    (_A, _X): (_X,), (_A, _C): (_X, _C), (_A, _F): (_F,), (_A, _U): (_X, _U),
    (_X, _X): (_X,), (_X, _C): (_C,), (_X, _F): (_F,), (_X, _U): (_U,),
    (_U, _C): (_C,), (_U, _F): (_F,),
}

_PHASE_TARGETS = {Phase.INTENT: _A, Phase.EXECUTING: _X, Phase.COMMITTED: _C, Phase.AMBIGUOUS: _U}
_MAX_RACES = 4


def journal_target(phase: str, step_state: StepState) -> EffectState | None:
    """The journal state a lifecycle point implies, or None when it writes nothing.

    One effect id covers every attempt made under it (idempotent retries, compensation
    retries, a resumed compensation), so a failure that will be retried (the step is back to
    ``executing`` or ``compensation-failed``) leaves the record ``executing``; only a step
    that ``failed`` for good fails its effect.
    """
    if phase == Phase.FAILED:
        return _F if step_state is StepState.FAILED else None
    return _PHASE_TARGETS.get(phase)


class EffectRecorder:
    """Journals the engine's lifecycle points as effect transitions; never raises into it.

    Cost: one write per lifecycle point. The record each write produced is kept in a small
    per-process cache, so the next transition of that effect compare-and-sets from it without
    a read; a stale entry loses the compare-and-set and is replaced by one read. A begin in a
    worker that did not write the admission costs that one read.

    A failing journal write is retried briefly, then logged and skipped: the saga record stays
    authoritative and the sweep's effect pass reports the effect left behind.
    """

    def __init__(
        self,
        journal: EffectJournal,
        *,
        retry_delays_s: Sequence[float] = (0.05, 0.25),
        cache_size: int = 4096,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.journal = journal
        self.retry_delays_s = tuple(retry_delays_s)
        self._sleep = sleep
        self._cache: OrderedDict[str, EffectRecord] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def record(self, event: LifecycleEvent, step_state: StepState) -> None:
        """Journal one lifecycle point; ``step_state`` is the step's state after the move."""
        target = journal_target(event.phase, step_state)
        if target is None:
            return
        stage = effect_stage(event.stage, step_state)
        for delay in (*self.retry_delays_s, None):
            try:
                self._apply(event, stage, target)
                return
            except StoreError as exc:
                self._forget(event.effect_id)
                if delay is None:
                    self._skipped(event, target, exc)
                    return
                self._sleep(delay)
            except Exception as exc:
                self._skipped(event, target, exc)
                return

    def clear(self) -> None:
        """Forget every remembered record (the next transition of each reads it again)."""
        with self._lock:
            self._cache.clear()

    def _apply(self, event: LifecycleEvent, stage: str, target: EffectState) -> None:
        if target is _A:
            # A retry's intent finds its effect journaled already: nothing to write.
            if self._known(event.effect_id) is None:
                self._remember(self._admit(event, stage))
            return
        for _ in range(_MAX_RACES):
            current = self._known(event.effect_id) or self.journal.get(event.effect_id)
            if current is None:
                current = self._admit(event, stage) or self.journal.get(event.effect_id)
            if current is None:
                continue
            try:
                for state in _PATHS.get((current.state, target), ()):
                    current = self._move(current, state, event.error_code)
                    self._remember(current)
                return
            except SagaConcurrencyError:
                self._forget(event.effect_id)
        raise SagaConcurrencyError(f"effect {event.effect_id!r} kept changing")

    def _admit(self, event: LifecycleEvent, stage: str) -> EffectRecord | None:
        return self.journal.admit_new(
            event.effect_id, event.capability, saga_id=event.saga_id, step=event.step, stage=stage
        )

    def _move(self, current: EffectRecord, to: EffectState, error_code: str | None) -> EffectRecord:
        effect_id = current.effect_id
        if to is current.state:
            return self.journal.touch(effect_id, known=current)
        if to is _X:
            return self.journal.begin(effect_id, known=current)
        if to is _C:
            return self.journal.commit(effect_id, known=current)
        if to is _F:
            return self.journal.fail(effect_id, error_code or codes.NOT_COMMITTED, known=current)
        return self.journal.mark_unknown(effect_id, error_code, known=current)

    def _known(self, effect_id: str) -> EffectRecord | None:
        with self._lock:
            return self._cache.get(effect_id)

    def _remember(self, record: EffectRecord | None) -> None:
        if record is None:
            return
        with self._lock:
            if record.state in FINAL_EFFECT_STATES:
                self._cache.pop(record.effect_id, None)
                return
            self._cache[record.effect_id] = record
            self._cache.move_to_end(record.effect_id)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def _forget(self, effect_id: str) -> None:
        with self._lock:
            self._cache.pop(effect_id, None)

    def _skipped(self, event: LifecycleEvent, target: EffectState, exc: Exception) -> None:
        level = logging.WARNING if isinstance(exc, (StoreError, SagaError)) else logging.ERROR
        logger.log(
            level,
            "effect journal: %s of effect %s not recorded (%s); the saga record stays "
            "authoritative and the sweep reports the effect",
            target, event.effect_id, type(exc).__name__,
            extra={**event.log_fields(), "journal_target": str(target)},
        )
