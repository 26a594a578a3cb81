"""Property tests of the pure protocol: random event sequences never reach a forbidden state.

Each example starts from a fresh running saga and applies a random sequence of transitions
whose arguments are drawn mostly from the record itself (its step names, effect ids and attempt
numbers) and sometimes from outside it, at random times that may even go backwards. Besides the
raw transitions, a sequence may ask ``decide`` for the next action (with a replay stub that is
consistent with the record) and carry it out, or settle an outcome as an operator would.
After every accepted write the invariants of docs/design.md §2 and §3 are checked; a refused write must leave
the record exactly as it was. The effects are a view of the saga record (docs/design.md §2.3),
so the same sequences check the effect state machine: along every accepted write, each effect
``effects_of`` derives either stays where it was or moves along ``EFFECT_TRANSITIONS``, a new
effect appears in ``admission``, and every effect of a final saga is final.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_sagas._protocol import codes, moves
from celery_sagas._protocol.decide import decide
from celery_sagas._protocol.decisions import SagaPolicy, StepPolicy
from celery_sagas._protocol.effects import (
    EFFECT_TRANSITIONS,
    FINAL_EFFECT_STATES,
    effects_of,
)
from celery_sagas._protocol.kinds import APPROVAL_TASK
from celery_sagas._protocol.replay import Crashed, Diverged, Outcome, Refused, Returned, Suspended
from celery_sagas._protocol.resolution import Resolution, resolve
from celery_sagas._records import (
    AttemptRef,
    EffectState,
    SagaRecord,
    SagaState,
    StepRecord,
    StepState,
)
from celery_sagas.errors import IllegalTransition, SagaResolutionError

from .protocol_builders import T0, apply_decision, intent

S = StepState
SS = SagaState
T = TypeVar("T")
PROPERTY = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
POLICY = SagaPolicy(
    max_compensation_attempts=2,
    stale_ms=1_000,
    grace_ms=1_000,
    default_time_limit_ms=5_000,
    steps={"task.idem": StepPolicy(idempotent=True, attempts_per_effect=2)},
    compensators_idempotent=frozenset({"undo.idem"}),
)
CODES = ("card_declined", "out_of_stock", codes.TIME_LIMIT, codes.WORKER_LOST, codes.RUN_FAILED,
         codes.NONDETERMINISTIC, codes.STEP_ERROR)

# Every state change a step may make, self-loops included.
STEP_EDGES = {
    S.EXECUTING: {S.EXECUTING, S.COMMITTED, S.FAILED, S.AMBIGUOUS},
    S.AWAITING_APPROVAL: {S.AWAITING_APPROVAL, S.COMMITTED, S.FAILED},
    S.AMBIGUOUS: {S.AMBIGUOUS, S.COMMITTED, S.FAILED},
    S.COMMITTED: {S.COMMITTED, S.COMPENSATING},
    S.COMPENSATING: {S.COMPENSATING, S.COMPENSATED, S.COMPENSATION_FAILED},
    S.COMPENSATION_FAILED: {S.COMPENSATION_FAILED, S.COMPENSATING, S.COMPENSATED},
    S.FAILED: {S.FAILED},
    S.COMPENSATED: {S.COMPENSATED},
}
UNDO_STATES = {S.COMPENSATING, S.COMPENSATION_FAILED, S.COMPENSATED}
LEFT_OPEN = {S.EXECUTING, S.AWAITING_APPROVAL, S.AMBIGUOUS, S.COMPENSATING, S.COMPENSATION_FAILED}


class Picks:
    """A stream of choices read from bytes hypothesis drew once (cheap; shrinks toward 0)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.at = 0

    def _byte(self) -> int:
        value = self.raw[self.at] if self.at < len(self.raw) else 0
        self.at += 1
        return value

    def int(self, low: int, high: int) -> int:
        span = high - low + 1
        value = self._byte() if span <= 256 else self._byte() | self._byte() << 8
        return low + value % span

    def pick(self, options: Sequence[T]) -> T:
        return options[self.int(0, len(options) - 1)]

    def more(self) -> bool:
        return self.at < len(self.raw)


CHOICES = st.binary(min_size=300, max_size=1500)
SHORT_CHOICES = st.binary(max_size=40)


@dataclass
class World:
    """The record under test and what the sequence has seen so far."""

    saga: SagaRecord
    now: int = T0
    fresh: int = 0
    ever_committed: set[str] = field(default_factory=set)
    accepted: int = 0


# ---------------------------------------------------------------- argument draws


def draw_step(p: Picks, world: World) -> StepRecord | None:
    """A recorded step, or None for a step the saga does not have."""
    if not world.saga.steps or p.int(0, 9) == 0:
        return None
    return p.pick(world.saga.steps)


def draw_name(p: Picks, found: StepRecord | None) -> str:
    """The step's name, or one the saga does not know."""
    return "ghost" if found is None else found.name


def draw_effect(p: Picks, found: StepRecord | None, compensation: bool) -> str:
    """Mostly the right effect id for the step, sometimes the other one or a stranger."""
    if found is None:
        return "fx-ghost"
    right = found.compensation_effect_id if compensation else found.effect_id
    wrong = found.effect_id if compensation else found.compensation_effect_id
    return p.pick([right, right, right, right, wrong, "fx-ghost"])


def draw_attempt(p: Picks, found: StepRecord | None, compensation: bool) -> int:
    """Mostly the step's current attempt, sometimes another."""
    right = 1 if found is None else (found.compensation_attempts if compensation else found.attempts)
    return p.pick([right, right, right, right + 1, max(0, right - 1), 0])


def draw_time(p: Picks, world: World) -> int:
    """Advance the clock, mostly a little, sometimes a lot or backwards."""
    jump = p.int(-1_000, 8_000) if p.int(0, 3) == 0 else p.int(0, 1_500)
    world.now = max(T0, world.now + jump)
    return world.now


def new_step(p: Picks, world: World, *, reuse: bool = True) -> StepRecord:
    """A new step intent (rarely reusing a name, to be refused)."""
    existing = [s.name for s in world.saga.steps]
    if reuse and existing and p.int(0, 19) == 0:
        name = p.pick(existing)
    else:
        world.fresh += 1
        name = f"s{world.fresh}"
    state = p.pick([S.EXECUTING] * 9 + [S.AWAITING_APPROVAL])
    gate = state is S.AWAITING_APPROVAL
    return intent(
        name,
        # an approval gate is recorded with the approval task (no side effect, no effect)
        task=APPROVAL_TASK if gate else p.pick([f"task.{name}", "task.idem"]),
        compensator=p.pick([f"undo.{name}", f"undo.{name}", "undo.idem", None]),
        state=state,
        dispatched_at_ms=world.now,
        approval_id=f"ap-{name}" if gate else None,
    )


# ---------------------------------------------------------------- events


Event = Callable[[SagaRecord], SagaRecord]


def step_event(p: Picks, world: World) -> tuple[str, Event] | None:
    """Any step transition with arguments drawn from the record."""
    found = draw_step(p, world)
    name, now = draw_name(p, found), draw_time(p, world)
    kind = p.pick([
        "claim_step", "commit_step", "fail_step", "step_ambiguous", "release_step", "abandon_step",
        "mark_redispatched", "begin_compensation", "claim_compensation", "compensation_succeeded",
        "compensation_failed", "compensation_ambiguous", "pass_gate", "fail_gate",
    ])
    back = "compensation" in kind
    eid, attempt = draw_effect(p, found, back), draw_attempt(p, found, back)
    code, later = p.pick(CODES), now + p.int(0, 3_000)
    approval = p.pick([f"ap-{name}", f"ap-{name}", "ap-other"])
    ref = AttemptRef(name, eid, attempt)
    events: dict[str, Event] = {
        "claim_step": lambda s: moves.claim_step(s, name, eid, "w", now),
        "commit_step": lambda s: moves.commit_step(s, ref, {"n": name}, now),
        "fail_step": lambda s: moves.fail_step(s, ref, code, now),
        "step_ambiguous": lambda s: moves.step_ambiguous(s, ref, code, now),
        "release_step": lambda s: moves.release_step(s, ref, later, code, now),
        "abandon_step": lambda s: moves.abandon_step(s, name, eid, now),
        "mark_redispatched": lambda s: moves.mark_redispatched(s, name, now),
        "begin_compensation": lambda s: moves.begin_compensation(s, name, now),
        "claim_compensation": lambda s: moves.claim_compensation(s, name, eid, "w", now),
        "compensation_succeeded": lambda s: moves.compensation_succeeded(s, ref, now),
        "compensation_failed": lambda s: moves.compensation_failed(s, ref, later, now),
        "compensation_ambiguous": lambda s: moves.compensation_ambiguous(s, ref, now),
        "pass_gate": lambda s: moves.pass_gate(s, name, approval, {"ok": True}, now),
        "fail_gate": lambda s: moves.fail_gate(s, name, approval, codes.APPROVAL_DENIED, now),
    }
    return kind, events[kind]


def saga_event(p: Picks, world: World) -> tuple[str, Event]:
    """Any saga-level transition."""
    now, code = draw_time(p, world), p.pick(CODES)
    kind = p.pick([
        "append_steps", "complete", "start_compensation", "cancel", "finish_compensation",
        "to_manual_review", "resume",
    ])
    if kind == "append_steps":
        new = [new_step(p, world) for _ in range(p.int(1, 2))]
        return kind, lambda s: moves.append_steps(s, new, now)
    events: dict[str, Event] = {
        "complete": lambda s: moves.complete(s, now),
        "start_compensation": lambda s: moves.start_compensation(s, code, "run() refused", now),
        "cancel": lambda s: moves.cancel(s, now),
        "finish_compensation": lambda s: moves.finish_compensation(s, now),
        "to_manual_review": lambda s: moves.to_manual_review(s, code, "needs a look", now),
        "resume": lambda s: moves.resume(s, now),
    }
    return kind, events[kind]


def operator_event(p: Picks, world: World) -> tuple[str, Event]:
    """An operator resolution with arguments drawn from the record."""
    found = draw_step(p, world)
    name, now = draw_name(p, found), draw_time(p, world)
    outcome = p.pick(list(Resolution))
    back = outcome in (Resolution.COMPENSATED, Resolution.NOT_COMPENSATED)
    eid, code = draw_effect(p, found, back), p.pick([None, *CODES])
    return "resolve", lambda s: resolve(s, name, eid, outcome, now_ms=now, max_compensation_attempts=2,
                                        result={"by": "operator"}, error_code=code)


def consistent_replay(p: Picks, world: World) -> Outcome:
    """An outcome ``context.replay`` could produce for this record."""
    record = world.saga
    all_committed = all(s.state is S.COMMITTED for s in record.steps)
    kind = p.int(0, 29)
    if kind == 0:
        return Refused("out_of_stock", "refused")
    if kind == 1:
        return Crashed(codes.RUN_FAILED, "boom")
    if kind == 2:
        return Diverged("asked for another step")
    if not all_committed:
        return Suspended()
    if kind < 7 and len(record.steps) >= 1 + kind % 5:  # sagas of one to five steps
        return Returned()
    return Suspended(tuple(new_step(p, world, reuse=False) for _ in range(p.int(1, 2))))


def decide_event(p: Picks, world: World) -> tuple[str, Event] | None:
    """Ask decide for the next action and carry it out as the engine would."""
    now = draw_time(p, world)
    outcome = consistent_replay(p, world)
    claimed = [e for s in world.saga.steps for e in (s.effect_id, s.compensation_effect_id)]
    dead = frozenset(e for e in claimed if p.int(0, 3) == 0)
    decision = decide(world.saga, lambda: outcome, now, POLICY, dead)
    label = f"decide:{type(decision).__name__}"
    return label, lambda s: apply_decision(s, decision, now)


# ---------------------------------------------------------------- invariants


def check_record(record: SagaRecord, world: World) -> None:
    """The docs/design.md §2 and §3 invariants of any saga a sequence reaches."""
    names = [s.name for s in record.steps]
    ids = [e for s in record.steps for e in (s.effect_id, s.compensation_effect_id)]
    assert len(set(names)) == len(names), "repeated step name"
    assert len(set(ids)) == len(ids), "repeated effect id"
    assert record.created_at_ms <= record.updated_at_ms
    assert not (record.state is SS.RUNNING and record.rolling_back), "running while rolling back"
    if record.state is SS.COMPLETED:
        assert all(s.state is S.COMMITTED for s in record.steps), "completed with a step not committed"
    if record.state is SS.COMPENSATED:
        assert not any(s.state in LEFT_OPEN for s in record.steps), "compensated with open steps"
        assert not any(s.state is S.COMMITTED and s.compensator for s in record.steps), (
            "compensated with a committed step that has a compensator")
    if record.state is SS.MANUAL_REVIEW:
        assert record.error_code and record.reason, "manual review without a reason code"
    for s in record.steps:
        if s.state in UNDO_STATES:
            assert s.name in world.ever_committed and s.committed_at_ms is not None, (
                f"step {s.name} compensated but never committed")
    if record.state.final:
        open_effects = [(e.effect_id, str(e.state)) for e in effects_of(record, capability)
                        if e.state not in FINAL_EFFECT_STATES]
        assert not open_effects, f"{record.state} saga with effects not final: {open_effects}"


def capability(_saga: SagaRecord, _step: StepRecord, compensation: bool) -> str:
    return "saga.compensate" if compensation else "saga.execute"


def check_effects(before: SagaRecord, after: SagaRecord, label: str) -> None:
    """Along one accepted write, every effect of the view moves along the effect table only."""
    old = {e.effect_id: e for e in effects_of(before, capability)}
    new = {e.effect_id: e for e in effects_of(after, capability)}
    for effect_id, was in old.items():
        now = new.get(effect_id)
        assert now is not None, f"{label}: effect {effect_id} ({was.stage}, {was.state}) disappeared"
        assert now.state is was.state or now.state in EFFECT_TRANSITIONS[was.state], (
            f"{label}: effect {effect_id} ({was.stage}) moved {was.state} -> {now.state}")
    for effect_id, now in new.items():
        if effect_id not in old:
            assert now.state is EffectState.ADMISSION, (
                f"{label}: effect {effect_id} ({now.stage}) appeared in {now.state}")


def check_write(before: SagaRecord, after: SagaRecord, label: str, world: World) -> None:
    """The invariants of one accepted write from ``before`` to ``after``."""
    assert not before.state.final, f"{label} changed a final saga"
    assert after.version == before.version + 1, label
    assert after.updated_at_ms >= before.updated_at_ms, label
    assert (after.saga_id, after.definition, after.input, after.created_at_ms) == (
        before.saga_id, before.definition, before.input, before.created_at_ms)
    assert not (before.rolling_back and not after.rolling_back), f"{label} stopped rolling back"
    assert [s.name for s in after.steps[: len(before.steps)]] == [s.name for s in before.steps]
    for old, new in zip(before.steps, after.steps[: len(before.steps)], strict=True):
        assert (new.effect_id, new.compensation_effect_id, new.task, new.args, new.kwargs) == (
            old.effect_id, old.compensation_effect_id, old.task, old.args, old.kwargs), label
        assert new.state in STEP_EDGES[old.state], f"{label}: step {old.state} -> {new.state}"
        assert new.attempts >= old.attempts, label
        if label != "resume":
            assert new.compensation_attempts >= old.compensation_attempts, label
    world.ever_committed |= {s.name for s in after.steps if s.state is S.COMMITTED}
    check_effects(before, after, label)
    check_record(after, world)


def run_event(world: World, label: str, event: Event) -> None:
    """Apply one event; a refusal must change nothing, an acceptance must keep every invariant."""
    before = world.saga
    snapshot = copy.deepcopy(before)
    try:
        after = event(before)
    except (IllegalTransition, SagaResolutionError):
        assert before == snapshot, f"refused {label} changed its input"
        assert not label.startswith("decide:"), f"{label}: decide chose a move the transitions refuse"
        return
    assert before == snapshot, f"{label} changed its input"
    if after is before:  # a Wait decision writes nothing
        return
    check_write(before, after, label, world)
    world.saga = after
    world.accepted += 1


def worker_event(p: Picks, world: World) -> tuple[str, Event] | None:
    """A worker claiming or reporting on a step in flight with the right ids and attempts."""
    busy = [s for s in world.saga.steps
            if s.state in (S.EXECUTING, S.COMPENSATING, S.AWAITING_APPROVAL)]
    if not busy:
        return None
    found = p.pick(busy)
    now, code = draw_time(p, world), p.pick(CODES)
    name, eid, cid = found.name, found.effect_id, found.compensation_effect_id
    attempt, comp = found.attempts, found.compensation_attempts
    forth, back = AttemptRef(name, eid, attempt), AttemptRef(name, cid, comp)
    if found.state is S.AWAITING_APPROVAL:
        approval = found.approval_id or ""
        return p.pick([
            ("pass_gate", lambda s: moves.pass_gate(s, name, approval, {"ok": True}, now)),
            ("fail_gate", lambda s: moves.fail_gate(s, name, approval, codes.APPROVAL_EXPIRED, now)),
        ])
    if found.state is S.EXECUTING and found.started_at_ms is None:
        return "claim_step", lambda s: moves.claim_step(s, name, eid, "w", now)
    if found.state is S.COMPENSATING and found.started_at_ms is None:
        return "claim_compensation", lambda s: moves.claim_compensation(s, name, cid, "w", now)
    forward: list[tuple[str, Event]] = [
        ("commit_step", lambda s: moves.commit_step(s, forth, {"n": name}, now)),
        ("fail_step", lambda s: moves.fail_step(s, forth, code, now)),
        ("step_ambiguous", lambda s: moves.step_ambiguous(s, forth, code, now)),
    ]
    backward: list[tuple[str, Event]] = [
        ("compensation_succeeded", lambda s: moves.compensation_succeeded(s, back, now)),
        ("compensation_failed", lambda s: moves.compensation_failed(s, back, now + 50, now)),
        ("compensation_ambiguous", lambda s: moves.compensation_ambiguous(s, back, now)),
    ]
    if found.state is S.EXECUTING:
        return p.pick([*[forward[0]] * 6, forward[1], forward[2]])
    return p.pick([*[backward[0]] * 3, *[backward[1]] * 2, backward[2]])


def operator_fix(p: Picks, world: World) -> tuple[str, Event] | None:
    """An operator settling the unknown outcome a review names, or resuming once none is left."""
    if world.saga.state is not SS.MANUAL_REVIEW:
        return None
    now = draw_time(p, world)
    unknown = moves.unresolved_ambiguity(world.saga)
    if unknown is None:
        return "resume", lambda s: moves.resume(s, now)
    name = unknown.name
    if unknown.state is S.AMBIGUOUS:
        outcome, eid = p.pick([Resolution.COMMITTED, Resolution.NOT_COMMITTED]), unknown.effect_id
    else:
        outcome = p.pick([Resolution.COMPENSATED, Resolution.NOT_COMPENSATED])
        eid = unknown.compensation_effect_id
    return "resolve", lambda s: resolve(s, name, eid, outcome, now_ms=now, max_compensation_attempts=2,
                                        result={"by": "operator"})


SOURCES: list[Callable[[Picks, World], tuple[str, Event] | None]] = [
    *[step_event] * 3, *[worker_event] * 3, *[decide_event] * 3, saga_event, operator_event,
    operator_fix,
]
DRIVERS = [*[decide_event] * 5, *[worker_event] * 5, operator_fix]


@PROPERTY
@given(CHOICES)
def test_random_event_sequences_keep_every_invariant(choices: bytes) -> None:
    p = Picks(choices)
    world = World(SagaRecord("order-42", "place-order", SS.RUNNING, {"sku": "A-1"}, T0, T0))
    while p.more():
        source = p.pick(SOURCES)
        drawn = source(p, world)
        if drawn is not None:
            run_event(world, *drawn)
    check_record(world.saga, world)


@PROPERTY
@given(CHOICES)
def test_decide_driven_sagas_only_take_legal_moves(choices: bytes) -> None:
    """Worker reports are always right; only decide and the workers move the saga."""
    p = Picks(choices)
    world = World(SagaRecord("order-42", "place-order", SS.RUNNING, {}, T0, T0))
    while p.more():
        drawn = p.pick(DRIVERS)(p, world)
        if drawn is not None:
            run_event(world, *drawn)
        if world.saga.state.final:
            break
    check_record(world.saga, world)
