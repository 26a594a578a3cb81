"""Saga and step transitions from tables: every move x saga context x step state.

Each one-step saga is built in a context (running, compensating, in review going forward or
back, completed, compensated) around a step in one of twelve variants. A legal pair gives the
specified result with ``version + 1``; every other pair raises ``IllegalTransition`` and leaves the
input as it was. Focused tests below cover fencing, attempts and the settle rules on sagas
with several steps.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from celery_sagas._protocol import codes, moves
from celery_sagas._protocol.effects import marked
from celery_sagas._records import AttemptRef, SagaRecord, SagaState, StepRecord, StepState
from celery_sagas.errors import IllegalTransition, SagaValidationError

from .protocol_builders import (
    AM,
    AMBIGUOUS_VARIANTS,
    AW,
    CD,
    CF,
    CM,
    COMPENSATING,
    CONTEXTS,
    FL,
    LIVE,
    NOW,
    OPEN,
    P0,
    P1,
    PA,
    REVIEW,
    RUNNING,
    T0,
    UPDATED,
    VARIANTS,
    X0,
    X1,
    XR,
    assert_refused,
    cx,
    frozen_copy,
    fx,
    in_context,
    intent,
    saga,
    step,
)

SS = SagaState
S = StepState
RESULT = {"charge": "ch_1"}
RETRY_AT = NOW + 2_000

Apply = Callable[[SagaRecord, StepRecord, int], SagaRecord]


@dataclass(frozen=True)
class Move:
    """A transition, when it is legal, and what it does to the step (None: step untouched)."""

    name: str
    apply: Apply
    legal: Callable[[str, str], bool]
    step_after: Callable[[StepRecord, int], StepRecord] | None = None
    settles: bool = False


def where(contexts: frozenset[str], variants: frozenset[str] | tuple[str, ...]) -> Callable[[str, str], bool]:
    """Legal exactly in these contexts around these step variants."""
    return lambda c, v: c in contexts and v in variants


ALL = frozenset(VARIANTS)
ROLLING_BACK = frozenset(c for c in OPEN if CONTEXTS[c][1])  # open contexts rolling back
KNOWN = ALL - AMBIGUOUS_VARIANTS

MOVES = [
    Move(
        "claim_step",
        lambda s, st, now: moves.claim_step(s, st.name, st.effect_id, "worker-9", now),
        where(frozenset({RUNNING}), (X0, XR)),
        lambda st, now: replace(st, attempts=st.attempts + 1, started_at_ms=now,
                                claimed_by="worker-9", next_attempt_at_ms=None),
    ),
    Move(
        "commit_step",
        lambda s, st, now: moves.commit_step(s, AttemptRef.execution(st), RESULT, now),
        where(OPEN, (X1, AM)),
        lambda st, now: replace(st, state=S.COMMITTED, result=RESULT, committed_at_ms=now,
                                error_code=None),
        settles=True,
    ),
    Move(
        "fail_step",
        lambda s, st, now: moves.fail_step(s, AttemptRef.execution(st), "out_of_stock", now),
        where(OPEN, (X1, AM)),
        lambda st, now: replace(st, state=S.FAILED, error_code="out_of_stock"),
        settles=True,
    ),
    Move(
        "step_ambiguous",
        lambda s, st, now: moves.step_ambiguous(s, AttemptRef.execution(st),
                                                codes.TIME_LIMIT, now),
        # while rolling back also a step released for a retry that will not be claimed now
        lambda c, v: where(OPEN, (X1,))(c, v) or where(ROLLING_BACK, (XR,))(c, v),
        lambda st, now: replace(st, state=S.AMBIGUOUS, error_code=codes.TIME_LIMIT),
        settles=True,
    ),
    Move(
        "step_ambiguous(compensate=True)",
        lambda s, st, now: moves.step_ambiguous(s, AttemptRef.execution(st), codes.TIME_LIMIT,
                                                now, compensate=True),
        lambda c, v: where(OPEN, (X1,))(c, v) or where(ROLLING_BACK, (XR,))(c, v),
        lambda st, now: replace(st, state=S.COMMITTED, outcome_unknown=True, result=None,
                                error_code=codes.TIME_LIMIT, next_attempt_at_ms=None,
                                committed_at_ms=now),
        settles=True,
    ),
    Move(
        "release_step",
        lambda s, st, now: moves.release_step(s, AttemptRef.execution(st), RETRY_AT,
                                              codes.WORKER_LOST, now),
        where(frozenset({RUNNING}), (X1,)),
        lambda st, now: replace(st, started_at_ms=None, claimed_by=None, next_attempt_at_ms=RETRY_AT,
                                error_code=codes.WORKER_LOST, dispatched_at_ms=None),
    ),
    Move(
        "abandon_step",
        lambda s, st, now: moves.abandon_step(s, st.name, st.effect_id, now),
        where(frozenset({COMPENSATING}), (X0, AW)),
        lambda st, now: replace(st, state=S.FAILED, error_code=codes.NOT_STARTED),
        settles=True,
    ),
    Move(
        "abandon_step(nothing_committed=True)",
        lambda s, st, now: moves.abandon_step(s, st.name, st.effect_id, now,
                                              nothing_committed=True),
        # also a step released for a retry_on retry: its last attempt committed nothing
        where(frozenset({COMPENSATING}), (X0, AW, XR)),
        lambda st, now: replace(st, state=S.FAILED,
                                error_code=st.error_code if st.attempts else codes.NOT_STARTED),
        settles=True,
    ),
    Move(
        "mark_redispatched",
        lambda s, st, now: moves.mark_redispatched(s, st.name, now),
        where(LIVE, (X0, XR, P0)),
        lambda st, now: replace(st, dispatched_at_ms=now),
    ),
    Move(
        "pass_gate",
        lambda s, st, now: moves.pass_gate(s, st.name, f"ap-{st.name}", RESULT, now),
        where(frozenset({RUNNING}), (AW,)),
        lambda st, now: replace(st, state=S.COMMITTED, result=RESULT, committed_at_ms=now, attempts=1),
        settles=True,
    ),
    Move(
        "fail_gate",
        lambda s, st, now: moves.fail_gate(s, st.name, f"ap-{st.name}", codes.APPROVAL_DENIED, now),
        where(OPEN, (AW,)),
        lambda st, now: replace(st, state=S.FAILED, error_code=codes.APPROVAL_DENIED),
        settles=True,
    ),
    Move(
        "begin_compensation",
        lambda s, st, now: moves.begin_compensation(s, st.name, now),
        where(frozenset({COMPENSATING}), (CM, CF)),
        lambda st, now: replace(st, state=S.COMPENSATING,
                                compensation_attempts=st.compensation_attempts + 1,
                                started_at_ms=None, claimed_by=None, next_attempt_at_ms=None,
                                dispatched_at_ms=now),
    ),
    Move(
        "claim_compensation",
        lambda s, st, now: moves.claim_compensation(s, st.name, st.compensation_effect_id,
                                                    "worker-9", now),
        where(frozenset({COMPENSATING}), (P0,)),
        lambda st, now: replace(st, started_at_ms=now, claimed_by="worker-9"),
    ),
    Move(
        "compensation_succeeded",
        lambda s, st, now: moves.compensation_succeeded(s, AttemptRef.compensation(st), now),
        where(OPEN, (P1, PA)),
        lambda st, now: replace(st, state=S.COMPENSATED, error_code=None, next_attempt_at_ms=None),
        settles=True,
    ),
    Move(
        "compensation_failed",
        lambda s, st, now: moves.compensation_failed(s, AttemptRef.compensation(st), RETRY_AT, now),
        where(OPEN, (P1, PA)),
        lambda st, now: replace(st, state=S.COMPENSATION_FAILED, error_code=codes.COMPENSATION_FAILED,
                                next_attempt_at_ms=RETRY_AT, started_at_ms=None, claimed_by=None),
        settles=True,
    ),
    Move(
        "compensation_ambiguous",
        lambda s, st, now: moves.compensation_ambiguous(s, AttemptRef.compensation(st), now),
        where(OPEN, (P1, PA)),
        lambda st, now: replace(st, error_code=codes.AMBIGUOUS_COMPENSATION),
        settles=True,
    ),
]

SAGA_MOVES: dict[str, tuple[Apply, Callable[[str, str], bool]]] = {
    # a failed step in a saga going forward raised StepFailed in run, which caught it
    "complete": (lambda s, st, now: moves.complete(s, now), where(frozenset({RUNNING}), (CM, FL))),
    "start_compensation": (
        lambda s, st, now: moves.start_compensation(s, "out_of_stock", "run() refused", now),
        where(frozenset({RUNNING}), ALL),
    ),
    "cancel": (
        lambda s, st, now: moves.cancel(s, now),
        lambda c, v: c == RUNNING or (c in REVIEW and v in KNOWN),
    ),
    "finish_compensation": (
        lambda s, st, now: moves.finish_compensation(s, now),
        where(frozenset({COMPENSATING}), (FL, CD)),
    ),
    "to_manual_review": (
        lambda s, st, now: moves.to_manual_review(s, codes.RUN_FAILED, "run() raised", now),
        where(LIVE, ALL),
    ),
    "resume": (lambda s, st, now: moves.resume(s, now), where(REVIEW, KNOWN)),
    "append_steps": (
        lambda s, st, now: moves.append_steps(s, [intent("next")], now),
        where(frozenset({RUNNING}), ALL),
    ),
}

CASES = list(itertools.product(CONTEXTS, VARIANTS))


def _is_ambiguous(st: StepRecord) -> bool:
    return st.state is S.AMBIGUOUS or (
        st.state is S.COMPENSATING and st.error_code == codes.AMBIGUOUS_COMPENSATION
    )


def expected_after_step_move(before: SagaRecord, moved: StepRecord, settles: bool) -> SagaRecord:
    """The saga of docs/design.md §2 around one moved step (an oracle written apart from the module)."""
    after = replace(before, steps=marked(replace(before, steps=(moved,)), NOW).steps,
                    version=before.version + 1, updated_at_ms=max(NOW, before.updated_at_ms))
    if not settles:
        return after
    # a known failure turns the saga back; so does an unknown outcome compensated as declared
    turns_back = moved.state is S.FAILED or bool(moved.outcome_unknown)
    rolling = before.rolling_back or turns_back
    after = replace(after, rolling_back=rolling)
    if turns_back and before.state is SS.RUNNING and not before.rolling_back:
        after = replace(after, error_code=moved.error_code)
    if _is_ambiguous(moved):
        if before.state is SS.MANUAL_REVIEW:
            return after
        code = codes.AMBIGUOUS_STEP if moved.state is S.AMBIGUOUS else codes.AMBIGUOUS_COMPENSATION
        return replace(after, state=SS.MANUAL_REVIEW, error_code=code)
    if before.state is SS.MANUAL_REVIEW and before.error_code in codes.AUTO_LIFTED:
        return replace(after, state=SS.COMPENSATING if rolling else SS.RUNNING)
    if after.state is SS.RUNNING and rolling:
        return replace(after, state=SS.COMPENSATING)
    return after


def _check_reason(before: SagaRecord, after: SagaRecord, moved: StepRecord) -> None:
    entered_review = after.state is SS.MANUAL_REVIEW and before.state is not SS.MANUAL_REVIEW
    if entered_review:
        effect = moved.effect_id if moved.state is S.AMBIGUOUS else moved.compensation_effect_id
        assert after.reason is not None
        assert moved.name in after.reason and effect in after.reason
    lifted = before.state is SS.MANUAL_REVIEW and after.state is not SS.MANUAL_REVIEW
    if lifted:
        assert after.error_code not in codes.AUTO_LIFTED


def each_variant(check: Callable[[str], None]) -> None:
    """Run ``check`` for every step variant and report every variant that failed, not just one."""
    failures = []
    for variant in VARIANTS:
        try:
            check(variant)
        except (Exception, pytest.fail.Exception) as exc:
            failures.append(f"{variant}: {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("move", MOVES, ids=lambda m: m.name)
@pytest.mark.parametrize("context", CONTEXTS)
def test_step_move_table(move: Move, context: str) -> None:
    each_variant(lambda variant: check_step_move(move, context, variant))


def check_step_move(move: Move, context: str, variant: str) -> None:
    """One cell of the step-move table."""
    record = in_context(context, variant)
    target = record.steps[0]
    if not move.legal(context, variant):
        assert_refused(lambda s: move.apply(s, target, NOW), record)
        return
    before = frozen_copy(record)
    after = move.apply(record, target, NOW)
    assert record == before
    assert move.step_after is not None
    moved = move.step_after(target, NOW)
    # the effect marks follow the step (tests/unit/test_protocol_effect.py holds them to the table)
    assert after.steps == marked(replace(record, steps=(moved,)), NOW).steps
    expected = expected_after_step_move(record, moved, move.settles)
    lifted = record.state is SS.MANUAL_REVIEW and after.state is not SS.MANUAL_REVIEW
    ignore = {"reason"} | ({"error_code"} if lifted else set())
    for name in SagaRecord.__slots__:
        if name not in ignore:
            assert getattr(after, name) == getattr(expected, name), name
    _check_reason(record, after, moved)


@pytest.mark.parametrize("name", sorted(SAGA_MOVES))
@pytest.mark.parametrize("context", CONTEXTS)
def test_saga_move_table(name: str, context: str) -> None:
    each_variant(lambda variant: check_saga_move(name, context, variant))


def check_saga_move(name: str, context: str, variant: str) -> None:
    """One cell of the saga-move table."""
    apply, legal = SAGA_MOVES[name]
    record = in_context(context, variant)
    if not legal(context, variant):
        assert_refused(lambda s: apply(s, s.steps[0], NOW), record)
        return
    before = frozen_copy(record)
    after = apply(record, record.steps[0], NOW)
    assert record == before
    assert after.version == record.version + 1
    assert after.updated_at_ms == NOW
    assert (after.saga_id, after.definition, after.input, after.created_at_ms) == (
        record.saga_id, record.definition, record.input, record.created_at_ms)
    SAGA_RESULTS[name](record, after)


def _complete(before: SagaRecord, after: SagaRecord) -> None:
    assert after.state is SS.COMPLETED
    assert after.steps == before.steps
    assert (after.error_code, after.reason) == (None, None)


def _start_compensation(before: SagaRecord, after: SagaRecord) -> None:
    assert after.state is SS.COMPENSATING and after.rolling_back
    assert (after.error_code, after.reason) == ("out_of_stock", "run() refused")
    assert after.steps == before.steps


def _cancel(before: SagaRecord, after: SagaRecord) -> None:
    assert after.state is SS.COMPENSATING and after.rolling_back
    assert after.error_code == codes.CANCELLED
    assert after.steps == before.steps


def _finish(before: SagaRecord, after: SagaRecord) -> None:
    assert after.state is SS.COMPENSATED
    assert after.steps == before.steps


def _review(before: SagaRecord, after: SagaRecord) -> None:
    assert after.state is SS.MANUAL_REVIEW
    assert (after.error_code, after.reason) == (codes.RUN_FAILED, "run() raised")
    assert after.rolling_back == before.rolling_back
    assert after.steps == before.steps


def _resume(before: SagaRecord, after: SagaRecord) -> None:
    assert after.state is (SS.COMPENSATING if before.rolling_back else SS.RUNNING)
    assert after.rolling_back == before.rolling_back
    (old,), (new,) = before.steps, after.steps
    if old.state is S.COMPENSATION_FAILED:
        # the compensation effect is the one begun, still executing: a fresh budget, not a new effect
        assert old.compensation is not None
        mark = replace(old.compensation, attempt=0, at_ms=max(NOW, old.compensation.at_ms))
        assert new == replace(old, compensation_attempts=0, next_attempt_at_ms=None, compensation=mark)
    else:
        assert new == old
    if not before.rolling_back:
        assert after.error_code is None
    elif old.state is S.FAILED:
        assert after.error_code == old.error_code
    else:
        assert after.error_code == codes.CANCELLED


def _append(before: SagaRecord, after: SagaRecord) -> None:
    assert after.steps == marked(replace(before, steps=(*before.steps, intent("next"))), NOW).steps
    assert after.state is SS.RUNNING


SAGA_RESULTS: dict[str, Callable[[SagaRecord, SagaRecord], None]] = {
    "complete": _complete,
    "start_compensation": _start_compensation,
    "cancel": _cancel,
    "finish_compensation": _finish,
    "to_manual_review": _review,
    "resume": _resume,
    "append_steps": _append,
}


@pytest.mark.parametrize("move", MOVES, ids=lambda m: m.name)
def test_clock_going_back_never_moves_updated_at_back(move: Move) -> None:
    context, variant = next((c, v) for c, v in CASES if move.legal(c, v))
    record = in_context(context, variant)
    after = move.apply(record, record.steps[0], T0)
    assert after.updated_at_ms == UPDATED
    assert after.version == record.version + 1


# ---------------------------------------------------------------- fencing and attempts

FENCED = [m for m in MOVES if m.name not in (
    "mark_redispatched", "begin_compensation", "pass_gate", "fail_gate")]


def _first_legal(move: Move) -> tuple[str, str]:
    return next((c, v) for c, v in CASES if move.legal(c, v))


def _uses_compensation_id(move: Move) -> bool:
    return "compensation" in move.name


@pytest.mark.parametrize("move", FENCED, ids=lambda m: m.name)
@pytest.mark.parametrize("wrong", ["other", "swapped", "unknown-step"])
def test_wrong_effect_id_or_step_is_refused(move: Move, wrong: str) -> None:
    context, variant = _first_legal(move)
    record = in_context(context, variant)
    target = record.steps[0]
    if wrong == "other":
        target = replace(target, effect_id="fx-stale", compensation_effect_id="cx-stale")
    elif wrong == "swapped":
        target = replace(target, effect_id=target.compensation_effect_id,
                         compensation_effect_id=target.effect_id)
    else:
        target = replace(target, name="nope")
    assert_refused(lambda s: move.apply(s, target, NOW), record)


ATTEMPTED = [m for m in MOVES if m.name in (
    "commit_step", "fail_step", "step_ambiguous", "release_step",
    "compensation_succeeded", "compensation_failed", "compensation_ambiguous")]


@pytest.mark.parametrize("move", ATTEMPTED, ids=lambda m: m.name)
@pytest.mark.parametrize("delta", [-1, 1, 5])
def test_another_attempt_is_refused(move: Move, delta: int) -> None:
    context, variant = _first_legal(move)
    record = in_context(context, variant)
    target = record.steps[0]
    target = replace(target, attempts=target.attempts + delta,
                     compensation_attempts=target.compensation_attempts + delta)
    assert_refused(lambda s: move.apply(s, target, NOW), record)


def test_an_attempt_that_never_claimed_cannot_report() -> None:
    record = saga(step(X0))
    assert_refused(lambda s: moves.commit_step(s, AttemptRef("s", fx("s"), 0), RESULT, NOW), record)
    assert_refused(lambda s: moves.fail_step(s, AttemptRef("s", fx("s"), 0), "declined", NOW), record)
    assert_refused(lambda s: moves.step_ambiguous(s, AttemptRef("s", fx("s"), 0), "time_limit", NOW), record)


@pytest.mark.parametrize("gate", ["pass_gate", "fail_gate"])
@pytest.mark.parametrize("approval", ["ap-other", "fx-s", None])
def test_a_gate_needs_its_own_approval_id(gate: str, approval: str | None) -> None:
    record = saga(step(AW))
    if gate == "pass_gate":
        assert_refused(lambda s: moves.pass_gate(s, "s", approval, RESULT, NOW), record)  # type: ignore[arg-type]
    else:
        assert_refused(lambda s: moves.fail_gate(s, "s", approval, "approval_denied", NOW), record)  # type: ignore[arg-type]
    assert_refused(lambda s: moves.pass_gate(s, "nope", "ap-s", RESULT, NOW), record)


def test_a_denied_gate_rolls_back_what_came_before() -> None:
    record = saga(step(CM, "a"), step(AW, "b"))
    after = moves.fail_gate(record, "b", "ap-b", codes.APPROVAL_EXPIRED, NOW)
    assert after.state is SS.COMPENSATING and after.rolling_back
    assert after.error_code == codes.APPROVAL_EXPIRED
    assert after.steps[1].state is S.FAILED


def test_a_passed_gate_commits_and_the_saga_goes_on() -> None:
    record = saga(step(CM, "a"), step(AW, "b"))
    after = moves.pass_gate(record, "b", "ap-b", {"approved_by": "alice"}, NOW)
    assert after.state is SS.RUNNING
    assert after.steps[1].state is S.COMMITTED
    assert after.steps[1].result == {"approved_by": "alice"}
    assert moves.complete(after, NOW + 1).state is SS.COMPLETED


def test_a_duplicate_claim_loses() -> None:
    claimed = moves.claim_step(saga(step(X0)), "s", fx("s"), "w1", NOW)
    assert claimed.steps[0].attempts == 1
    assert_refused(lambda s: moves.claim_step(s, "s", fx("s"), "w2", NOW + 1), claimed)


def test_a_claim_is_withdrawn_only_by_its_own_claimer_and_the_step_is_as_before() -> None:
    before = saga(step(X0))
    claimed = moves.claim_step(before, "s", fx("s"), "w1", NOW)
    ref = AttemptRef("s", fx("s"), 1)
    assert_refused(lambda s: moves.withdraw_claim(s, ref, "w2", NOW), claimed)
    assert_refused(lambda s: moves.withdraw_claim(s, AttemptRef("s", fx("s"), 2), "w1", NOW), claimed)
    assert_refused(lambda s: moves.withdraw_claim(s, ref, "w1", NOW), before)
    withdrawn = moves.withdraw_claim(claimed, ref, "w1", NOW + 1)
    assert withdrawn.version == claimed.version + 1
    assert (withdrawn.steps[0].attempts, withdrawn.steps[0].started_at_ms,
            withdrawn.steps[0].claimed_by) == (0, None, None)
    again = moves.claim_step(withdrawn, "s", fx("s"), "w1", NOW + 2)
    assert (again.steps[0].attempts, again.steps[0].started_at_ms) == (1, NOW + 2)


def test_a_compensation_claim_is_withdrawn_by_its_claimer() -> None:
    record = saga(step(P0), state=SS.COMPENSATING)
    claimed = moves.claim_compensation(record, "s", cx("s"), "w1", NOW)
    ref = AttemptRef.compensation(claimed.steps[0])
    assert_refused(lambda s: moves.withdraw_claim(s, ref, "w2", NOW), claimed)
    withdrawn = moves.withdraw_claim(claimed, ref, "w1", NOW + 1)
    assert (withdrawn.steps[0].started_at_ms, withdrawn.steps[0].claimed_by) == (None, None)
    assert withdrawn.steps[0].compensation_attempts == claimed.steps[0].compensation_attempts
    assert moves.claim_compensation(withdrawn, "s", cx("s"), "w1", NOW + 2).steps[0].started_at_ms == NOW + 2


def test_claim_is_refused_while_rolling_back_even_if_running() -> None:
    odd = saga(step(X0), state=SS.RUNNING, rolling_back=True)
    assert_refused(lambda s: moves.claim_step(s, "s", fx("s"), "w1", NOW), odd)


def test_a_duplicate_compensation_claim_loses() -> None:
    record = saga(step(P0), state=SS.COMPENSATING)
    claimed = moves.claim_compensation(record, "s", cx("s"), "w1", NOW)
    assert_refused(lambda s: moves.claim_compensation(s, "s", cx("s"), "w2", NOW), claimed)


def test_compensation_reports_need_a_claimed_compensator() -> None:
    record = saga(step(P0), state=SS.COMPENSATING)
    assert_refused(lambda s: moves.compensation_succeeded(s, AttemptRef("s", cx("s"), 1), NOW), record)
    assert_refused(lambda s: moves.compensation_failed(s, AttemptRef("s", cx("s"), 1), NOW, NOW), record)


def test_execution_reports_refuse_the_compensation_effect_id() -> None:
    record = saga(step(X1))
    assert_refused(lambda s: moves.commit_step(s, AttemptRef("s", cx("s"), 1), None, NOW), record)
    back = saga(step(P1), state=SS.COMPENSATING)
    assert_refused(lambda s: moves.compensation_succeeded(s, AttemptRef("s", fx("s"), 1), NOW), back)


def test_begin_and_redispatch_refuse_unknown_steps() -> None:
    assert_refused(lambda s: moves.begin_compensation(s, "nope", NOW),
                   saga(step(CM), state=SS.COMPENSATING))
    assert_refused(lambda s: moves.mark_redispatched(s, "nope", NOW), saga(step(X0)))


def test_redispatch_of_a_claimed_compensator_is_refused() -> None:
    assert_refused(lambda s: moves.mark_redispatched(s, "s", NOW),
                   saga(step(P1), state=SS.COMPENSATING))


# ---------------------------------------------------------------- append


def test_append_records_several_intents_in_order() -> None:
    record = saga(step(CM, "a"))
    after = moves.append_steps(record, (intent("b"), intent("c")), NOW)
    assert [s.name for s in after.steps] == ["a", "b", "c"]
    assert after.version == record.version + 1


@pytest.mark.parametrize(
    "new",
    [
        pytest.param((), id="nothing"),
        pytest.param((intent("a"),), id="existing-name"),
        pytest.param((intent("b"), intent("b", effect_id="fx-z", compensation_effect_id="cx-z")),
                     id="repeated-name"),
        pytest.param((intent("b", effect_id=fx("a")),), id="existing-effect-id"),
        pytest.param((intent("b", compensation_effect_id=cx("a")),), id="existing-compensation-id"),
        pytest.param((intent("b", compensation_effect_id=fx("a")),), id="compensation-id-is-effect-id"),
        pytest.param((intent("b", compensation_effect_id=fx("b")),), id="same-id-twice-in-a-step"),
        pytest.param((intent("b", attempts=1),), id="already-attempted"),
        pytest.param((step(CM, "b"),), id="committed"),
        pytest.param((step(FL, "b"),), id="failed"),
        pytest.param((step(AM, "b"),), id="ambiguous"),
        pytest.param((step(P0, "b"),), id="compensating"),
    ],
)
def test_append_refuses_bad_intents(new: tuple[StepRecord, ...]) -> None:
    assert_refused(lambda s: moves.append_steps(s, new, NOW), saga(step(CM, "a")))


def test_append_accepts_an_approval_gate_and_refuses_while_rolling_back() -> None:
    gated = intent("b", state=S.AWAITING_APPROVAL, approval_id="ap-1")
    after = moves.append_steps(saga(step(CM, "a")), [gated], NOW)
    assert after.steps[-1] == gated
    odd = saga(step(CM, "a"), state=SS.RUNNING, rolling_back=True)
    assert_refused(lambda s: moves.append_steps(s, [intent("b")], NOW), odd)


# ---------------------------------------------------------------- settle rules


def test_ambiguity_waits_for_steps_in_flight_before_review() -> None:
    record = saga(step(X1, "a"), step(X1, "b"))
    one = moves.step_ambiguous(record, AttemptRef("a", fx("a"), 1), codes.WORKER_LOST, NOW)
    assert one.state is SS.RUNNING
    assert one.steps[0].state is S.AMBIGUOUS
    two = moves.commit_step(one, AttemptRef("b", fx("b"), 1), RESULT, NOW + 1)
    assert two.state is SS.MANUAL_REVIEW
    assert two.error_code == codes.AMBIGUOUS_STEP
    assert two.reason is not None and "'a'" in two.reason and fx("a") in two.reason


def test_ambiguity_waits_for_a_sibling_that_then_fails() -> None:
    record = saga(step(X1, "a"), step(X1, "b"))
    one = moves.step_ambiguous(record, AttemptRef("a", fx("a"), 1), codes.WORKER_LOST, NOW)
    two = moves.fail_step(one, AttemptRef("b", fx("b"), 1), "out_of_stock", NOW + 1)
    assert two.state is SS.MANUAL_REVIEW
    assert two.error_code == codes.AMBIGUOUS_STEP
    assert two.rolling_back
    settled = moves.commit_step(two, AttemptRef("a", fx("a"), 1), RESULT, NOW + 2)
    assert settled.state is SS.COMPENSATING
    assert settled.error_code == "out_of_stock"


def test_a_known_failure_turns_a_running_saga_to_compensating() -> None:
    record = saga(step(CM, "a"), step(X1, "b"))
    after = moves.fail_step(record, AttemptRef("b", fx("b"), 1), "card_declined", NOW)
    assert after.state is SS.COMPENSATING
    assert after.rolling_back
    assert after.error_code == "card_declined"
    assert after.reason is not None and "'b'" in after.reason


def test_a_failure_while_a_sibling_is_in_flight_still_turns_back() -> None:
    record = saga(step(X1, "a"), step(X1, "b"))
    after = moves.fail_step(record, AttemptRef("a", fx("a"), 1), "card_declined", NOW)
    assert after.state is SS.COMPENSATING
    assert after.steps[1].state is S.EXECUTING


def test_a_second_failure_keeps_the_first_cause() -> None:
    # two branches of a parallel group (steps of their own run one at a time)
    record = saga(step(X1, "a", group="parallel-1"), step(X1, "b", group="parallel-1"))
    one = moves.fail_step(record, AttemptRef("a", fx("a"), 1), "card_declined", NOW)
    two = moves.fail_step(one, AttemptRef("b", fx("b"), 1), "out_of_stock", NOW + 1)
    assert two.state is SS.COMPENSATING
    assert two.error_code == "card_declined"


def test_late_commit_of_the_ambiguous_step_lifts_the_review() -> None:
    record = saga(step(CM, "a"), step(AM, "b"), state=SS.MANUAL_REVIEW,
                  error_code=codes.AMBIGUOUS_STEP, reason="step 'b' is ambiguous")
    after = moves.commit_step(record, AttemptRef("b", fx("b"), 1), RESULT, NOW)
    assert after.state is SS.RUNNING
    assert after.error_code is None and after.reason is None
    assert after.steps[1].result == RESULT


def test_late_commit_while_rolling_back_returns_to_compensating() -> None:
    record = saga(step(CM, "a"), step(AM, "b"), state=SS.MANUAL_REVIEW, rolling_back=True,
                  error_code=codes.AMBIGUOUS_STEP, reason="step 'b' is ambiguous")
    after = moves.commit_step(record, AttemptRef("b", fx("b"), 1), RESULT, NOW)
    assert after.state is SS.COMPENSATING
    assert after.error_code not in codes.AUTO_LIFTED


def test_late_failure_of_the_ambiguous_step_turns_back() -> None:
    record = saga(step(CM, "a"), step(AM, "b"), state=SS.MANUAL_REVIEW,
                  error_code=codes.AMBIGUOUS_STEP, reason="step 'b' is ambiguous")
    after = moves.fail_step(record, AttemptRef("b", fx("b"), 1), "card_declined", NOW)
    assert after.state is SS.COMPENSATING
    assert after.rolling_back
    assert after.error_code == "card_declined"


def test_a_review_for_another_reason_is_not_lifted_by_a_late_commit() -> None:
    record = saga(step(AM, "a"), state=SS.MANUAL_REVIEW, error_code=codes.RUN_FAILED,
                  reason="run() raised")
    after = moves.commit_step(record, AttemptRef("a", fx("a"), 1), RESULT, NOW)
    assert after.state is SS.MANUAL_REVIEW
    assert after.error_code == codes.RUN_FAILED


def test_a_review_is_not_lifted_while_another_step_is_still_ambiguous() -> None:
    record = saga(step(AM, "a"), step(AM, "b"), state=SS.MANUAL_REVIEW,
                  error_code=codes.AMBIGUOUS_STEP, reason="step 'a' is ambiguous")
    after = moves.commit_step(record, AttemptRef("a", fx("a"), 1), RESULT, NOW)
    assert after.state is SS.MANUAL_REVIEW
    assert moves.unresolved_ambiguity(after) == after.steps[1]


def test_the_review_names_the_step_still_to_look_at() -> None:
    record = saga(step(X1, "a"), step(X1, "b"))
    one = moves.step_ambiguous(record, AttemptRef("a", fx("a"), 1), codes.WORKER_LOST, NOW)
    two = moves.step_ambiguous(one, AttemptRef("b", fx("b"), 1), codes.WORKER_LOST, NOW + 1)
    assert two.state is SS.MANUAL_REVIEW
    three = moves.commit_step(two, AttemptRef("a", fx("a"), 1), RESULT, NOW + 2)
    assert three.state is SS.MANUAL_REVIEW
    assert three.reason is not None and fx("b") in three.reason and fx("a") not in three.reason


def test_a_known_failure_beside_an_ambiguity_and_a_step_in_flight_turns_compensating() -> None:
    record = saga(step(AM, "a"), step(X1, "b"), step(X1, "c"))
    after = moves.fail_step(record, AttemptRef("b", fx("b"), 1), "card_declined", NOW)
    assert after.rolling_back
    assert after.state is SS.COMPENSATING


def test_compensation_ambiguity_goes_to_review_and_success_lifts_it() -> None:
    record = saga(step(CM, "a"), step(P1, "b"), state=SS.COMPENSATING, error_code=codes.CANCELLED)
    review = moves.compensation_ambiguous(record, AttemptRef("b", cx("b"), 1), NOW)
    assert review.state is SS.MANUAL_REVIEW
    assert review.error_code == codes.AMBIGUOUS_COMPENSATION
    assert review.reason is not None and cx("b") in review.reason
    assert_refused(lambda s: moves.claim_compensation(s, "b", cx("b"), "w", NOW), review)
    assert_refused(lambda s: moves.resume(s, NOW), review)
    lifted = moves.compensation_succeeded(review, AttemptRef("b", cx("b"), 1), NOW + 1)
    assert lifted.state is SS.COMPENSATING
    assert lifted.steps[1].state is S.COMPENSATED


def test_compensation_failure_after_ambiguity_returns_to_compensating() -> None:
    record = saga(step(PA, "b"), state=SS.MANUAL_REVIEW, rolling_back=True,
                  error_code=codes.AMBIGUOUS_COMPENSATION, reason="compensation is ambiguous")
    after = moves.compensation_failed(record, AttemptRef("b", cx("b"), 1), RETRY_AT, NOW)
    assert after.state is SS.COMPENSATING
    assert after.steps[0].state is S.COMPENSATION_FAILED
    assert after.steps[0].next_attempt_at_ms == RETRY_AT


def test_abandon_fails_only_unclaimed_steps_while_rolling_back() -> None:
    record = saga(step(CM, "a"), step(X0, "b"), step(X1, "c"), state=SS.COMPENSATING,
                  error_code=codes.CANCELLED)
    after = moves.abandon_step(record, "b", fx("b"), NOW)
    assert after.steps[1].state is S.FAILED
    assert after.steps[1].error_code == codes.NOT_STARTED
    assert after.state is SS.COMPENSATING
    assert after.error_code == codes.CANCELLED
    assert_refused(lambda s: moves.abandon_step(s, "c", fx("c"), NOW), after)
    assert_refused(lambda s: moves.abandon_step(s, "b", fx("b"), NOW), saga(step(X0, "b")))


def test_an_abandoned_intent_is_not_the_cause_of_a_resumed_rollback() -> None:
    record = saga(step(FL, "a", error_code=codes.NOT_STARTED), state=SS.MANUAL_REVIEW,
                  rolling_back=True, error_code=codes.COMPENSATION_EXHAUSTED, reason="x")
    assert moves.resume(record, NOW).error_code == codes.CANCELLED


# ---------------------------------------------------------------- saga level


def test_complete_needs_every_step_committed() -> None:
    assert moves.complete(saga(), NOW).state is SS.COMPLETED
    done = moves.complete(saga(step(CM, "a"), step(CM, "b")), NOW)
    assert done.state is SS.COMPLETED
    assert_refused(lambda s: moves.complete(s, NOW), saga(step(CM, "a"), step(X1, "b")))
    assert_refused(lambda s: moves.complete(s, NOW),
                   saga(step(CM, "a"), state=SS.RUNNING, rolling_back=True))


def test_a_step_without_a_compensator_cannot_begin_compensation() -> None:
    record = saga(step(CM, "a", compensator=None), state=SS.COMPENSATING)
    assert_refused(lambda s: moves.begin_compensation(s, "a", NOW), record)


def test_finish_compensation_skips_steps_without_a_compensator() -> None:
    record = saga(step(CM, "a", compensator=None), step(CD, "b"), step(FL, "c"),
                  state=SS.COMPENSATING)
    done = moves.finish_compensation(record, NOW)
    assert done.state is SS.COMPENSATED
    assert done.steps[0] == record.steps[0]


@pytest.mark.parametrize("left", [CM, CF, P0, P1, X0, X1, AW, AM])
def test_finish_compensation_refuses_while_something_is_left(left: str) -> None:
    record = saga(step(CD, "a"), step(left, "b"), state=SS.COMPENSATING)
    assert_refused(lambda s: moves.finish_compensation(s, NOW), record)


def test_cancel_rolls_back_a_running_saga_with_work_in_flight() -> None:
    record = saga(step(CM, "a"), step(X1, "b"))
    after = moves.cancel(record, NOW)
    assert after.state is SS.COMPENSATING and after.rolling_back
    assert after.error_code == codes.CANCELLED
    assert after.steps == record.steps


def test_cancel_from_review_needs_every_outcome_known() -> None:
    known = saga(step(CM, "a"), state=SS.MANUAL_REVIEW, error_code=codes.RUN_FAILED, reason="x")
    assert moves.cancel(known, NOW).state is SS.COMPENSATING
    unknown = saga(step(AM, "a"), state=SS.MANUAL_REVIEW, error_code=codes.AMBIGUOUS_STEP, reason="x")
    assert_refused(lambda s: moves.cancel(s, NOW), unknown)


@pytest.mark.parametrize("state", [SS.COMPENSATING, SS.COMPLETED, SS.COMPENSATED])
def test_cancel_refuses_sagas_already_going_back_or_final(state: SagaState) -> None:
    assert_refused(lambda s: moves.cancel(s, NOW), saga(step(CM, "a"), state=state))


def test_resume_gives_exhausted_compensations_a_fresh_budget() -> None:
    record = saga(
        step(CD, "a"),
        step(CF, "b", compensation_attempts=3),
        step(FL, "c"),
        state=SS.MANUAL_REVIEW, rolling_back=True,
        error_code=codes.COMPENSATION_EXHAUSTED, reason="failed 3 times",
    )
    after = moves.resume(record, NOW)
    assert after.state is SS.COMPENSATING
    assert after.steps[1].compensation_attempts == 0
    assert after.steps[1].next_attempt_at_ms is None
    assert after.steps[1].state is S.COMPENSATION_FAILED
    assert after.steps[0] == record.steps[0] and after.steps[2] == record.steps[2]
    assert after.error_code == "card_declined"


def test_resume_forward_clears_the_review_code() -> None:
    record = saga(step(CM, "a"), state=SS.MANUAL_REVIEW, error_code=codes.NONDETERMINISTIC, reason="x")
    after = moves.resume(record, NOW)
    assert after.state is SS.RUNNING
    assert (after.error_code, after.reason) == (None, None)


@pytest.mark.parametrize("state", [SS.RUNNING, SS.COMPENSATING, SS.COMPLETED, SS.COMPENSATED])
def test_resume_refuses_sagas_not_in_review(state: SagaState) -> None:
    assert_refused(lambda s: moves.resume(s, NOW), saga(step(CM, "a"), state=state))


def test_to_manual_review_keeps_the_direction() -> None:
    back = saga(step(CM, "a"), state=SS.COMPENSATING)
    after = moves.to_manual_review(back, codes.INVALID_RETRY_POLICY, "bad backoff", NOW)
    assert after.rolling_back
    assert moves.direction(after) is SS.COMPENSATING
    assert moves.direction(moves.to_manual_review(saga(), codes.RUN_FAILED, "x", NOW)) is SS.RUNNING


def test_unresolved_ambiguity_finds_forward_and_compensation_unknowns() -> None:
    assert moves.unresolved_ambiguity(saga(step(CM, "a"), step(P1, "b"))) is None
    forward = saga(step(CM, "a"), step(AM, "b"))
    assert moves.unresolved_ambiguity(forward) == forward.steps[1]
    both = saga(step(PA, "a"), step(AM, "b"))
    assert moves.unresolved_ambiguity(both) == both.steps[0]


FIRST = AttemptRef("s", fx("s"), 1)
BAD_CODES: list[tuple[str, Callable[[SagaRecord, str], SagaRecord], SagaRecord]] = [
    ("to_manual_review", lambda s, c: moves.to_manual_review(s, c, "why", NOW), saga(step(CM))),
    ("start_compensation", lambda s, c: moves.start_compensation(s, c, "why", NOW), saga(step(CM))),
    ("fail_step", lambda s, c: moves.fail_step(s, FIRST, c, NOW), saga(step(X1))),
    ("step_ambiguous", lambda s, c: moves.step_ambiguous(s, FIRST, c, NOW), saga(step(X1))),
    ("release_step", lambda s, c: moves.release_step(s, FIRST, NOW, c, NOW), saga(step(X1))),
    ("fail_gate", lambda s, c: moves.fail_gate(s, "s", "ap-s", c, NOW), saga(step(AW))),
]


@pytest.mark.parametrize(("name", "apply", "record"), BAD_CODES, ids=[b[0] for b in BAD_CODES])
@pytest.mark.parametrize("code", ["", "Not A Code"])
def test_an_invalid_error_code_is_refused(
    name: str, apply: Callable[[SagaRecord, str], SagaRecord], record: SagaRecord, code: str
) -> None:
    before = frozen_copy(record)
    with pytest.raises((IllegalTransition, SagaValidationError)):
        apply(record, code)
    assert record == before


# ---------------------------------------------------------------- one write


def test_one_write_collapses_several_transitions_into_one_version() -> None:
    record = saga(step(P1, "a"), state=SS.COMPENSATING, version=7)
    failed = moves.compensation_failed(record, AttemptRef("a", cx("a"), 1), NOW, NOW)
    parked = moves.to_manual_review(failed, codes.INVALID_RETRY_POLICY, "bad backoff", NOW)
    assert parked.version == 9
    written = moves.one_write(record, parked)
    assert written.version == 8
    assert replace(written, version=parked.version) == parked
    assert record.version == 7


def test_one_write_of_a_single_transition_is_that_transition() -> None:
    record = saga(step(X0, "a"))
    claimed = moves.claim_step(record, "a", fx("a"), "w", NOW)
    assert moves.one_write(record, claimed) == claimed


# ---------------------------------------------------------------- whole journeys


def _forward(record: SagaRecord, name: str, now: int) -> SagaRecord:
    record = moves.append_steps(record, [intent(name)], now)
    record = moves.claim_step(record, name, fx(name), "w", now + 1)
    return moves.commit_step(record, AttemptRef(name, fx(name), 1), {"n": name}, now + 2)


def test_happy_path_versions_count_every_write() -> None:
    record = saga(version=1)
    for i, name in enumerate(("reserve", "charge", "ship")):
        record = _forward(record, name, NOW + 10 * i)
    done = moves.complete(record, NOW + 100)
    assert done.state is SS.COMPLETED
    assert done.version == 1 + 3 * 3 + 1
    assert all(s.state is S.COMMITTED for s in done.steps)


def test_failure_then_compensation_in_reverse_reaches_compensated() -> None:
    record = saga(version=1)
    record = _forward(record, "reserve", NOW)
    record = _forward(record, "charge", NOW + 10)
    record = moves.append_steps(record, [intent("ship")], NOW + 20)
    record = moves.claim_step(record, "ship", fx("ship"), "w", NOW + 21)
    record = moves.fail_step(record, AttemptRef("ship", fx("ship"), 1), "no_courier", NOW + 22)
    assert record.state is SS.COMPENSATING
    for i, name in enumerate(("charge", "reserve")):
        t = NOW + 30 + 10 * i
        record = moves.begin_compensation(record, name, t)
        record = moves.claim_compensation(record, name, cx(name), "w", t + 1)
        record = moves.compensation_succeeded(record, AttemptRef(name, cx(name), 1), t + 2)
    done = moves.finish_compensation(record, NOW + 100)
    assert done.state is SS.COMPENSATED
    assert [s.state for s in done.steps] == [S.COMPENSATED, S.COMPENSATED, S.FAILED]


def test_idempotent_release_then_reclaim_counts_attempts() -> None:
    record = saga(step(X1, "a"))
    released = moves.release_step(record, AttemptRef("a", fx("a"), 1), RETRY_AT, codes.WORKER_LOST, NOW)
    again = moves.claim_step(released, "a", fx("a"), "w2", RETRY_AT)
    assert again.steps[0].attempts == 2
    assert again.steps[0].next_attempt_at_ms is None
    assert_refused(lambda s: moves.commit_step(s, AttemptRef("a", fx("a"), 1), None, NOW), again)
    done = moves.commit_step(again, AttemptRef("a", fx("a"), 2), RESULT, RETRY_AT + 1)
    assert done.steps[0].state is S.COMMITTED
