"""Effects over stored saga records (docs/design.md §2.3): no journal record kind, a view.

Every step execution and compensation is an effect whose state ``effects_of`` derives from the
saga record, so an effect is admitted, begins, commits, fails or turns unknown in the very
compare-and-set (or claim note) that moves its saga: one write, on the saga's version. These
tests follow effects through the repository over a store, as the engine writes them: the
admission, each move, refusals that write nothing, races on one version, the payload-free
shape of an effect and reads of a corrupt record. The effect state machine itself and the view
of every step state are in test_protocol_effect.py; the property that every legal sequence of
saga moves moves each effect along the table only is in test_protocol_properties.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

import pytest

from celery_sagas._codec import Codec
from celery_sagas._protocol import codes, moves
from celery_sagas._protocol.effects import EFFECT_TRANSITIONS, effects_of, marked
from celery_sagas._protocol.notes import ClaimNote
from celery_sagas._records import (
    SAGA,
    AttemptRef,
    EffectRecord,
    EffectState,
    SagaRecord,
    SagaState,
    StepRecord,
    StepState,
)
from celery_sagas._repository import Plan, SagaRepository
from celery_sagas.errors import (
    IllegalTransition,
    InvalidRecordError,
    SagaConcurrencyError,
    SagaValidationError,
)
from celery_sagas.stores.base import Envelope
from celery_sagas.stores.memory import MemoryStore
from celery_sagas.testing import ReadTogether, race

from .protocol_builders import intent

T0 = 1_700_000_000_000
THREADS = 16


class HookedStore(MemoryStore):
    """Runs ``after_get`` once, right after the next read: a writer slipping in between."""

    def __init__(self) -> None:
        super().__init__()
        self.after_get: Callable[[], Any] | None = None

    def get(self, kind: str, record_id: str) -> Envelope | None:
        found = super().get(kind, record_id)
        hook, self.after_get = self.after_get, None
        if hook is not None:
            hook()
        return found


def capability(_saga: SagaRecord, _step: StepRecord, compensation: bool) -> str:
    return "orders.refund" if compensation else "orders.charge"


@pytest.fixture
def store() -> HookedStore:
    return HookedStore()


@pytest.fixture
def repository(store: MemoryStore) -> SagaRepository:
    return SagaRepository(store, Codec())


def started(repository: SagaRepository, *, dispatched_at: int = T0) -> SagaRecord:
    """A saga created with the intent of its step ``charge`` (as ``start`` records it)."""
    record = marked(SagaRecord("s1", "place-order", SagaState.RUNNING, {"card": "card-1"}, T0, T0,
                                  (intent("charge", dispatched_at_ms=dispatched_at),), version=1), T0)
    assert repository.create(record)
    return record


def effect(repository: SagaRepository, effect_id: str = "fx-charge") -> EffectRecord:
    """The effect as the stored saga record says (read back through the codec)."""
    found = [e for e in effects_of(repository.load("s1"), capability) if e.effect_id == effect_id]
    assert len(found) == 1, f"no effect {effect_id}"
    return found[0]


def move(repository: SagaRepository, change: Callable[[SagaRecord], SagaRecord]) -> SagaRecord:
    """Write one move through the repository's compare-and-set loop."""
    written, _ = repository.update("s1", lambda saga: Plan(after=change(saga)))
    return written


def claim(repository: SagaRepository, at: int, claimer: str = "w-1") -> SagaRecord | None:
    """A delivery's claim: a note appended at the version it knows, without a read."""
    known = repository.known("s1") or repository.load("s1")
    note = ClaimNote("charge", "fx-charge", claimer, at).text()
    return repository.note("s1", note, known.version)


def ref(repository: SagaRepository) -> AttemptRef:
    step = repository.load("s1").step("charge")
    assert step is not None
    return AttemptRef.execution(step)


def stored(store: MemoryStore) -> Envelope | None:
    return store.get(SAGA, "s1")


# ------------------------------------------------------------------ admission


def test_a_recorded_intent_is_an_effect_in_admission_naming_its_saga_step_and_stage(
    repository: SagaRepository,
) -> None:
    # when
    started(repository)

    # then
    record = effect(repository)
    assert (record.state, record.version) == (EffectState.ADMISSION, 1)
    assert record.created_at_ms == record.updated_at_ms == T0
    assert (record.saga_id, record.step, record.stage, record.capability) == (
        "s1", "charge", "execution", "orders.charge")


def test_no_effect_record_is_written_beside_the_saga(repository: SagaRepository, store: MemoryStore) -> None:
    # when
    started(repository)
    claim(repository, T0 + 1)
    move(repository, lambda s: moves.commit_step(s, ref(repository), {"ok": 1}, T0 + 2))

    # then: the store holds the saga record and nothing else
    assert store.scan("effect", [str(s) for s in EffectState], limit=10).items == ()
    assert [e.id for e in store.scan(SAGA, [str(s) for s in SagaState], limit=10).items] == ["s1"]


def test_an_effect_keeps_its_id_and_admission_time_across_attempts(repository: SagaRepository) -> None:
    # given: the first attempt began and was released for a retry
    started(repository)
    claim(repository, T0 + 10)
    move(repository, lambda s: moves.release_step(s, ref(repository), T0 + 500, codes.WORKER_LOST, T0 + 20))
    before = effect(repository)

    # when: the retry is claimed
    claim(repository, T0 + 600, claimer="w-2")

    # then: one effect, still executing
    after = effect(repository)
    assert (before.state, after.state) == (EffectState.EXECUTING, EffectState.EXECUTING)
    assert after.created_at_ms == before.created_at_ms == T0


# ------------------------------------------------------------------ moves: one write each


def test_each_move_of_the_saga_moves_its_effect_in_the_same_write(
    repository: SagaRepository, store: MemoryStore
) -> None:
    # given
    started(repository)
    versions = [stored(store).version]  # type: ignore[union-attr]

    # when: claimed (a note), then committed (a compare-and-set)
    claim(repository, T0 + 10)
    begun = effect(repository)
    versions.append(stored(store).version)  # type: ignore[union-attr]
    move(repository, lambda s: moves.commit_step(s, ref(repository), {"ok": 1}, T0 + 20))
    committed = effect(repository)
    versions.append(stored(store).version)  # type: ignore[union-attr]

    # then: one write per move, and the effect is on the version of the saga that holds it
    assert versions == [1, 2, 3]
    assert (begun.state, begun.version, begun.updated_at_ms) == (EffectState.EXECUTING, 2, T0 + 10)
    assert (committed.state, committed.version, committed.updated_at_ms) == (
        EffectState.COMMITTED, 3, T0 + 20)
    assert committed.state in EFFECT_TRANSITIONS[begun.state]


def test_a_known_failure_fails_the_effect_with_its_error_code(repository: SagaRepository) -> None:
    started(repository)
    claim(repository, T0 + 10)
    move(repository, lambda s: moves.fail_step(s, ref(repository), "card_declined", T0 + 20))
    record = effect(repository)
    assert (record.state, record.error_code) == (EffectState.FAILED, "card_declined")


def test_an_unknown_outcome_makes_the_effect_unknown_with_its_error_code(repository: SagaRepository) -> None:
    started(repository)
    claim(repository, T0 + 10)
    move(repository, lambda s: moves.step_ambiguous(s, ref(repository), codes.WORKER_LOST, T0 + 20))
    record = effect(repository)
    assert (record.state, record.error_code) == (EffectState.UNKNOWN, "worker_lost")


def test_a_step_abandoned_before_it_began_fails_its_effect_from_admission(repository: SagaRepository) -> None:
    started(repository)
    move(repository, lambda s: moves.cancel(s, T0 + 5))
    move(repository, lambda s: moves.abandon_step(s, "charge", "fx-charge", T0 + 6))
    record = effect(repository)
    assert (record.state, record.error_code) == (EffectState.FAILED, "not_started")


@pytest.mark.parametrize("code", ["", "9lives", "has space", "x" * 65, None])
def test_an_invalid_error_code_writes_nothing(
    repository: SagaRepository, store: MemoryStore, code: Any
) -> None:
    # given
    started(repository)
    claim(repository, T0 + 10)
    before = stored(store)

    # when / then
    with pytest.raises(SagaValidationError):
        move(repository, lambda s: moves.fail_step(s, ref(repository), code, T0 + 20))
    assert stored(store) == before
    assert effect(repository).state is EffectState.EXECUTING


def test_an_illegal_move_raises_and_writes_nothing(repository: SagaRepository, store: MemoryStore) -> None:
    # given: a committed step
    started(repository)
    claim(repository, T0 + 10)
    attempt = ref(repository)
    move(repository, lambda s: moves.commit_step(s, attempt, {"ok": 1}, T0 + 20))
    before = stored(store)

    # when / then: a late failure report of the same attempt cannot move a committed effect
    with pytest.raises(IllegalTransition):
        move(repository, lambda s: moves.fail_step(s, attempt, "card_declined", T0 + 30))
    assert stored(store) == before
    assert effect(repository).state is EffectState.COMMITTED


def test_a_clock_going_backwards_never_moves_an_effects_updated_at_back(repository: SagaRepository) -> None:
    # given: the intent was recorded at T0 + 100 by a process whose clock runs ahead
    started(repository, dispatched_at=T0 + 100)
    admitted = effect(repository)

    # when: a worker whose clock is behind claims it
    claim(repository, T0 + 50)

    # then
    begun = effect(repository)
    assert begun.state is EffectState.EXECUTING
    assert begun.updated_at_ms >= admitted.updated_at_ms


# ------------------------------------------------------------------ races on one version


def test_concurrent_claims_on_one_version_exactly_one_begins_the_effect(
    repository: SagaRepository, store: MemoryStore
) -> None:
    # given: as many deliveries of the step as threads, each claiming on the version it knows
    started(repository)
    notes = [ClaimNote("charge", "fx-charge", f"w-{i}", T0 + 10).text() for i in range(THREADS)]

    # when
    results = race(lambda i: SagaRepository(store, Codec()).note("s1", notes[i], 1), THREADS)

    # then
    winners = [r for r in results if isinstance(r, SagaRecord)]
    assert len(winners) == 1 and results.count(None) == THREADS - 1, results
    step = repository.load("s1").step("charge")
    assert step is not None and step.claimed_by == winners[0].step("charge").claimed_by  # type: ignore[union-attr]
    assert effect(repository).state is EffectState.EXECUTING


def test_concurrent_writers_of_one_version_exactly_one_moves_the_effect(store: MemoryStore) -> None:
    # given: every racer reads version 1 before any writes
    started(SagaRepository(store, Codec()))
    racing = ReadTogether(store, THREADS)

    def begin(i: int) -> object:
        repository = SagaRepository(racing, Codec())
        written, _ = repository.update(
            "s1", lambda s: Plan(after=moves.claim_step(s, "charge", "fx-charge", f"w-{i}", T0 + i)))
        return written

    # when
    results = race(begin, THREADS)

    # then: the losers read again, judge again and are refused (the effect began already)
    winners = [r for r in results if isinstance(r, SagaRecord)]
    losers = [r for r in results if isinstance(r, IllegalTransition)]
    assert len(winners) == 1 and len(losers) == THREADS - 1, results
    assert effect(SagaRepository(store, Codec())).state is EffectState.EXECUTING


def test_a_writer_that_lost_the_race_gets_a_concurrency_error_and_writes_nothing(
    repository: SagaRepository, store: HookedStore
) -> None:
    # given: a rival cancels the saga right after this writer read it
    started(repository)
    rival = SagaRepository(store, Codec())
    store.after_get = lambda: move(rival, lambda s: moves.cancel(s, T0 + 5))
    before = repository.load("s1")

    # when / then
    with pytest.raises(SagaConcurrencyError):
        repository.write(before, moves.claim_step(before, "charge", "fx-charge", "w-1", T0 + 10))
    current = repository.load("s1")
    assert current.state is SagaState.COMPENSATING
    assert effect(repository).state is EffectState.ADMISSION


# ------------------------------------------------------------------ shape and reads


def test_an_effect_record_has_no_field_for_a_payload() -> None:
    assert {f.name for f in fields(EffectRecord)} == {
        "effect_id", "capability", "state", "created_at_ms", "updated_at_ms", "version", "target",
        "digest", "tenant_id", "principal_id", "error_code", "saga_id", "step", "stage",
    }


def test_the_effects_of_a_stored_saga_carry_none_of_its_payloads(repository: SagaRepository) -> None:
    # given
    started(repository)
    claim(repository, T0 + 10)
    move(repository, lambda s: moves.commit_step(s, ref(repository), {"receipt": "rc-secret"}, T0 + 20))

    # then
    for record in effects_of(repository.load("s1"), capability):
        assert not {"card-1", "rc-secret", "key"} & {str(getattr(record, f.name)) for f in fields(record)}


def test_a_corrupt_saga_record_raises_invalid_record_instead_of_showing_effects(
    repository: SagaRepository, store: MemoryStore
) -> None:
    started(repository)
    with store._lock:
        key = (SAGA, "s1")
        store._records[key] = replace(store._records[key], body='{"definition":"BAD NAME"}')
    with pytest.raises(InvalidRecordError):
        repository.load("s1")


def test_a_claim_note_that_does_not_parse_makes_the_record_corrupt(
    repository: SagaRepository, store: MemoryStore
) -> None:
    started(repository)
    assert store.annotate(SAGA, "s1", '{"claim":["charge"]}') is not None
    with pytest.raises(InvalidRecordError):
        repository.load("s1")


def test_a_claim_note_for_another_effect_is_ignored_by_every_reader(repository: SagaRepository) -> None:
    # given: a stale delivery claims an effect id the step does not have
    started(repository)
    stale = ClaimNote("charge", "fx-other", "w-old", T0 + 10).text()
    assert repository.note("s1", stale, 1) is not None

    # then
    record = repository.load("s1")
    assert record.version == 2
    assert effect(repository).state is EffectState.ADMISSION
    assert record.steps[0].state is StepState.EXECUTING and record.steps[0].claimed_by is None
