"""The SVG geometry: bars on the plot, marks for failures, ambiguity, retries and attempts."""

from __future__ import annotations

from celery_sagas import EffectState, SagaRecord, SagaState, StepRecord, StepState
from celery_sagas._records import EffectMark
from celery_sagas.web._chart import chart
from celery_sagas.web._source import Finishes
from celery_sagas.web._timeline import BREAK_WIDTH, LABEL_WIDTH, PLOT_WIDTH, TOP, timeline

T0 = 1_700_000_000_000


def mark(state: EffectState, at: int, attempt: int = 1, code: str | None = None) -> EffectMark:
    return EffectMark(state, at, attempt, code)


def step(name: str, state: StepState, **fields: object) -> StepRecord:
    return StepRecord(name=name, task=name, effect_id=f"{name}-e", compensation_effect_id=f"{name}-c",
                      state=state, compensator=f"{name}.undo", **fields)  # type: ignore[arg-type]


def saga(state: SagaState, *steps: StepRecord, updated: int = T0 + 10_000) -> SagaRecord:
    return SagaRecord("s-1", "order", state, {}, T0, updated, steps)


def test_a_committed_step_has_a_wait_and_a_run_bar_inside_the_plot() -> None:
    # given
    record = saga(SagaState.COMPLETED, step("a", StepState.COMMITTED, dispatched_at_ms=T0,
                                            started_at_ms=T0 + 2_000, committed_at_ms=T0 + 6_000,
                                            attempts=1))

    # when
    drawn = timeline(record, T0 + 60_000)

    # then
    wait, run = drawn.bars
    assert (wait.kind, run.kind) == ("wait", "run")
    assert wait.x == LABEL_WIDTH and run.x == wait.x + wait.width
    assert run.x + run.width <= LABEL_WIDTH + PLOT_WIDTH
    assert drawn.marks == () and (drawn.start_ms, drawn.end_ms) == (T0, T0 + 10_000)


def test_failures_ambiguity_attempts_and_retries_are_marked() -> None:
    # given
    record = saga(
        SagaState.RUNNING,
        step("a", StepState.COMMITTED, started_at_ms=T0, committed_at_ms=T0 + 1_000, attempts=3,
             execution=mark(EffectState.COMMITTED, T0 + 1_000, 3)),
        step("b", StepState.AMBIGUOUS, started_at_ms=T0 + 1_000, attempts=1, error_code="step_error",
             execution=mark(EffectState.UNKNOWN, T0 + 5_000, 1, "step_error")),
        step("c", StepState.EXECUTING, attempts=1, next_attempt_at_ms=T0 + 30_000,
             execution=mark(EffectState.EXECUTING, T0 + 2_000)),
    )

    # when
    drawn = timeline(record, T0 + 20_000)

    # then
    assert [m.symbol for m in drawn.marks] == ["\u00d73", "?", "⟳"]
    assert [b.kind for b in drawn.bars] == ["run", "unknown", "retry"]
    assert "step_error" in drawn.marks[1].title
    assert drawn.end_ms == T0 + 30_000  # the retry's due time is on the plot


def test_a_failed_execution_ends_at_its_mark_with_its_error_code() -> None:
    # given
    record = saga(SagaState.COMPENSATED,
                  step("a", StepState.FAILED, started_at_ms=T0 + 1_000, attempts=1,
                       error_code="declined",
                       execution=mark(EffectState.FAILED, T0 + 4_000, 1, "declined")))

    # when
    drawn = timeline(record, T0 + 60_000)

    # then
    [run] = drawn.bars
    [gap] = drawn.gaps  # the 6 idle seconds after the failure are a break, not 60 % of the plot
    assert run.x + run.width == gap.x == LABEL_WIDTH + PLOT_WIDTH - BREAK_WIDTH
    assert (gap.start_ms, gap.end_ms, gap.label) == (T0 + 4_000, T0 + 10_000, "idle 6 s")
    [failed] = drawn.marks
    assert (failed.symbol, failed.title) == ("✕", "execution failed (declined)")


def test_compensations_run_in_their_own_lane_until_their_mark() -> None:
    # given
    record = saga(
        SagaState.COMPENSATED,
        step("a", StepState.COMPENSATED, committed_at_ms=T0 + 1_000, dispatched_at_ms=T0 + 6_000,
             compensation_attempts=1, compensation=mark(EffectState.COMMITTED, T0 + 8_000)),
        step("b", StepState.COMPENSATED, committed_at_ms=T0 + 2_000, dispatched_at_ms=T0 + 4_000,
             compensation_attempts=2, compensation=mark(EffectState.COMMITTED, T0 + 6_000, 2)),
        step("c", StepState.FAILED, started_at_ms=T0 + 3_000, attempts=1, error_code="declined",
             execution=mark(EffectState.FAILED, T0 + 3_500, 1, "declined")),
    )

    # when
    drawn = timeline(record, T0 + 20_000)

    # then
    undo = [b for b in drawn.bars if b.kind == "undo"]
    assert len(undo) == 2
    b_undo, a_undo = sorted(undo, key=lambda bar: bar.x)
    assert b_undo.x + b_undo.width == a_undo.x  # b's undo ends when a's begins
    assert {m.symbol for m in drawn.marks} == {"✕", "\u00d72"}


def test_an_unknown_compensation_runs_to_now_marked() -> None:
    # given
    record = saga(SagaState.MANUAL_REVIEW,
                  step("a", StepState.COMPENSATING, committed_at_ms=T0 + 1_000,
                       dispatched_at_ms=T0 + 2_000, started_at_ms=T0 + 2_500,
                       compensation_attempts=1, error_code="ambiguous_compensation",
                       compensation=mark(EffectState.UNKNOWN, T0 + 9_000, 1,
                                         "ambiguous_compensation")))

    # when
    drawn = timeline(record, T0 + 20_000)

    # then
    lane = [b for b in drawn.bars if b.y > TOP + 15]
    assert [b.kind for b in lane] == ["unknown"]
    assert lane[0].x + lane[0].width == LABEL_WIDTH + PLOT_WIDTH
    assert [m.symbol for m in drawn.marks] == ["?"]


def test_an_approval_gate_is_drawn_as_a_wait_until_now() -> None:
    # given
    record = saga(SagaState.RUNNING,
                  step("a", StepState.COMMITTED, started_at_ms=T0, committed_at_ms=T0 + 1_000),
                  step("gate", StepState.AWAITING_APPROVAL, approval_id="ap-1"))

    # when
    drawn = timeline(record, T0 + 20_000)

    # then
    gate = drawn.bars[-1]
    assert gate.kind == "approval"
    assert gate.x + gate.width == LABEL_WIDTH + PLOT_WIDTH


def test_the_chart_stacks_compensations_on_completions() -> None:
    # given
    finishes = Finishes(T0, (0, 2, 1), (0, 1, 0))

    # when
    drawn = chart(finishes)

    # then
    assert (drawn.peak, drawn.total_completed, drawn.total_compensated) == (3, 3, 1)
    done, undone, alone = drawn.bars  # minute 1: two completed, one compensated; minute 2: one
    assert (done.kind, undone.kind, alone.kind) == ("completed", "compensated", "completed")
    assert done.x == undone.x < alone.x
    assert undone.y + undone.height == done.y
    assert abs(done.height - 2 * alone.height) < 0.2


def test_seconds_of_work_before_hours_of_waiting_fill_the_plot() -> None:
    # given: two steps in the first 3 seconds, then a signal wait of two hours so far
    wait = StepRecord(name="signal:go", task="celery_sagas.wait_signal", effect_id="w-e",
                      compensation_effect_id="w-c", state=StepState.WAITING,
                      kwargs={"signal": "go", "timeout": 86400}, dispatched_at_ms=T0 + 3_000,
                      wake_at_ms=T0 + 86_400_000)
    record = saga(SagaState.RUNNING,
                  step("a", StepState.COMMITTED, started_at_ms=T0, committed_at_ms=T0 + 1_000),
                  step("b", StepState.COMMITTED, started_at_ms=T0 + 1_000,
                       committed_at_ms=T0 + 3_000),
                  wait, updated=T0 + 3_000)

    # when
    drawn = timeline(record, T0 + 7_200_000)

    # then: the work takes most of the plot; the idle stretches are marked breaks
    a, b, signal = drawn.bars
    assert a.width + b.width > PLOT_WIDTH / 4
    assert signal.kind == "signal" and "times out at" in signal.title
    assert len(drawn.gaps) == 2 and drawn.gaps[0].label == "idle 119 min"
    [deadline] = [m for m in drawn.marks if m.kind == "deadline"]
    assert deadline.x == LABEL_WIDTH + PLOT_WIDTH and "times out" in deadline.title


def test_an_exhausted_compensation_in_review_shows_no_next_attempt() -> None:
    # given
    record = saga(SagaState.MANUAL_REVIEW,
                  step("a", StepState.COMPENSATION_FAILED, dispatched_at_ms=T0 + 1_000,
                       compensation_attempts=5, next_attempt_at_ms=T0 + 5_000,
                       compensation=mark(EffectState.EXECUTING, T0 + 2_000, 5)),
                  updated=T0 + 3_000)

    # when
    drawn = timeline(record, T0 + 60_000)

    # then
    assert "retry" not in [b.kind for b in drawn.bars]
    assert drawn.end_ms == T0 + 60_000
