"""The invariant checker itself: each rule reports the breach it is there to catch."""

from __future__ import annotations

from typing import Any

import pytest

from celery_sagas._records import SagaRecord, SagaState, StepRecord, StepState
from tests.reliability.invariants import check

pytestmark = pytest.mark.e2e

T0 = 1_700_000_000_000


def _step(name: str, state: StepState, effect: str, comp: str = "", *,
          compensation_attempts: int = 0, error_code: str | None = None) -> StepRecord:
    # an ambiguous step was claimed once (its first attempt)
    return StepRecord(name, "t", effect, comp or f"c-{effect}", state, compensator="c",
                      attempts=1 if state is StepState.AMBIGUOUS else 0,
                      compensation_attempts=compensation_attempts, error_code=error_code)


def _saga(state: SagaState, *steps: StepRecord, saga_id: str = "s1") -> SagaRecord:
    return SagaRecord(saga_id, "rel-order", state, {}, T0, T0, tuple(steps), version=3)


def _line(op: str, effect: str, step: str = "rel.reserve", saga: str = "s1", attempt: int = 1,
          **extra: Any) -> dict[str, Any]:
    return {"op": op, "saga_id": saga, "step": step, "effect_id": effect, "attempt": attempt,
            **extra}


def _rules(records: dict[str, SagaRecord | None], ledger: list[dict[str, Any]],
           trace: list[dict[str, Any]] | None = None) -> list[str]:
    return sorted(v.rule for v in check(list(records), records, ledger, trace or []))


def test_a_clean_completed_saga_breaks_nothing() -> None:
    record = _saga(SagaState.COMPLETED, _step("rel.reserve", StepState.COMMITTED, "e1"))
    assert _rules({"s1": record}, [_line("reserve.start", "e1"), _line("reserve.done", "e1")]) == []


def test_lost_and_stuck_sagas_are_reported() -> None:
    assert _rules({"s1": None, "s2": _saga(SagaState.RUNNING, saga_id="s2")}, []) == ["lost", "stuck"]


def test_a_non_idempotent_body_started_twice_is_a_double_run() -> None:
    record = _saga(SagaState.MANUAL_REVIEW, _step("rel.reserve", StepState.AMBIGUOUS, "e1"))
    ledger = [_line("reserve.start", "e1"), _line("reserve.start", "e1", attempt=2)]
    assert _rules({"s1": record}, ledger) == ["double-run"]


def test_a_compensator_rerun_after_a_known_failure_is_allowed_but_not_after_a_vanished_run() -> None:
    step = _step("rel.reserve", StepState.COMPENSATED, "e1", comp="c1")
    record = _saga(SagaState.COMPENSATED, step)
    applied = [_line("reserve.start", "e1"), _line("reserve.done", "e1")]
    retried = [_line("release.start", "c1", undoes="e1"), _line("release.fail", "c1", undoes="e1"),
               _line("release.start", "c1", undoes="e1"), _line("release.done", "c1", undoes="e1")]
    assert _rules({"s1": record}, applied + retried) == []
    vanished = [_line("release.start", "c1", undoes="e1"), _line("release.start", "c1", undoes="e1"),
                _line("release.done", "c1", undoes="e1")]
    assert _rules({"s1": record}, applied + vanished) == ["double-run"]


def test_compensating_an_ambiguous_step_is_reported() -> None:
    record = _saga(SagaState.MANUAL_REVIEW, _step("rel.reserve", StepState.AMBIGUOUS, "e1", comp="c1"))
    ledger = [_line("reserve.start", "e1"), _line("release.start", "c1", undoes="e1")]
    assert "ambiguous-compensated" in _rules({"s1": record}, ledger)


def test_a_compensated_saga_must_undo_each_applied_effect_exactly_once() -> None:
    step = _step("rel.reserve", StepState.COMPENSATED, "e1", comp="c1")
    applied = [_line("reserve.start", "e1"), _line("reserve.done", "e1")]
    assert _rules({"s1": _saga(SagaState.COMPENSATED, step)}, applied) == ["undo-count"]
    twice = [_line("release.done", "c1", undoes="e1")] * 2
    assert "double-undo" in _rules({"s1": _saga(SagaState.COMPENSATED, step)}, applied + twice)


def test_a_commit_the_provider_never_applied_is_a_phantom() -> None:
    record = _saga(SagaState.COMPLETED, _step("rel.reserve", StepState.COMMITTED, "e1"))
    assert _rules({"s1": record}, [_line("reserve.start", "e1")]) == ["phantom-commit"]


def test_an_effect_applied_under_an_id_the_record_does_not_know_is_an_orphan() -> None:
    record = _saga(SagaState.COMPLETED, _step("rel.reserve", StepState.COMMITTED, "e1"))
    ledger = [_line("reserve.done", "e1"), _line("reserve.done", "other")]
    assert _rules({"s1": record}, ledger) == ["orphan-effect"]


def test_a_fenced_write_accepted_after_a_newer_grant_is_stale() -> None:
    record = _saga(SagaState.COMPLETED)
    trace = [
        {"ev": "grant", "lease": "l", "fence": 1, "t1": 10},
        {"ev": "grant", "lease": "l", "fence": 2, "t1": 20},
        {"ev": "write", "lease": "l", "fence": 1, "t0": 15, "t1": 16, "outcome": "ok", "id": "a"},
        {"ev": "write", "lease": "l", "fence": 1, "t0": 25, "t1": 26, "outcome": "refused", "id": "b"},
    ]
    assert _rules({"s1": record}, [], trace) == []
    late = {"ev": "write", "lease": "l", "fence": 1, "t0": 30, "t1": 31, "outcome": "ok", "id": "c"}
    assert _rules({"s1": record}, [], [*trace, late]) == ["stale-fence"]


def test_a_killed_non_idempotent_body_whose_step_did_not_end_ambiguous_was_guessed() -> None:
    killed = [_line("reserve.start", "e1")]
    ambiguous = _saga(SagaState.MANUAL_REVIEW, _step("rel.reserve", StepState.AMBIGUOUS, "e1"))
    assert sorted(v.rule for v in check(["s1"], {"s1": ambiguous}, killed, [], killed)) == []
    failed = _saga(SagaState.COMPENSATED, _step("rel.reserve", StepState.FAILED, "e1"))
    assert [v.rule for v in check(["s1"], {"s1": failed}, killed, [], killed)] == ["guessed"]


def test_a_sweep_write_without_its_fence_is_reported() -> None:
    record = _saga(SagaState.COMPLETED)
    saga = {"ev": "unfenced", "kind": "saga", "id": "s1", "state": "running", "outcome": "ok"}
    approval = {"ev": "unfenced", "kind": "approval", "id": "a1", "state": "expired", "outcome": "ok"}
    assert _rules({"s1": record}, [], []) == []
    assert _rules({"s1": record}, [], [saga]) == ["unfenced-sweep-write"]
    assert _rules({"s1": record}, [], [approval]) == ["unfenced-sweep-write"]


def _unknown_charge(task: str) -> StepRecord:
    """A charge killed mid-body and refunded because its outcome was unknown."""
    step = StepRecord("rel.charge_unknown", task, "e1", "c1", StepState.COMPENSATED,
                      compensator="rel.refund", outcome_unknown=True)
    return step


def test_a_declared_compensate_unknown_step_killed_mid_body_is_no_blind_compensation() -> None:
    killed = [_line("charge_unknown.start", "e1", step="rel.charge_unknown")]
    refund = [_line("refund.start", "c1", step="rel.charge_unknown", undoes="e1"),
              _line("refund.nothing", "c1", step="rel.charge_unknown", undoes="e1")]
    record = _saga(SagaState.COMPENSATED, _unknown_charge("rel.charge_unknown"))
    assert [v.rule for v in check(["s1"], {"s1": record}, killed + refund, [], killed)] == []


def test_an_unknown_outcome_compensated_without_the_declaration_is_blind() -> None:
    killed = [_line("charge.start", "e1", step="rel.charge_unknown")]
    refund = [_line("refund.start", "c1", step="rel.charge_unknown", undoes="e1")]
    record = _saga(SagaState.COMPENSATED, _unknown_charge("rel.charge"))
    rules = sorted(v.rule for v in check(["s1"], {"s1": record}, killed + refund, [], killed))
    assert rules == ["blind-compensation", "guessed", "undo-unapplied"]


def test_an_ambiguity_without_a_body_that_began_is_a_spurious_review() -> None:
    record = _saga(SagaState.MANUAL_REVIEW, _step("rel.reserve", StepState.AMBIGUOUS, "e1"))
    assert _rules({"s1": record}, [_line("reserve.start", "e1")]) == []
    assert _rules({"s1": record}, []) == ["spurious-review"]
    assert _rules({"s1": record}, [_line("reserve.start", "e1", attempt=2)]) == ["spurious-review"]


def test_an_ambiguous_compensation_without_a_compensator_that_began_is_a_spurious_review() -> None:
    step = _step("rel.reserve", StepState.COMPENSATING, "e1", comp="c1", compensation_attempts=1,
                 error_code="ambiguous_compensation")
    record = _saga(SagaState.MANUAL_REVIEW, step)
    applied = [_line("reserve.start", "e1"), _line("reserve.done", "e1")]
    began = _line("release.start", "c1", undoes="e1")
    assert _rules({"s1": record}, [*applied, began]) == []
    assert _rules({"s1": record}, applied) == ["spurious-review"]


def test_a_retry_on_body_runs_again_only_after_a_known_failure() -> None:
    # given: rel.charge_limited rate-limited twice (a .fail line each), then applied
    step = StepRecord("rel.charge_limited", "rel.charge_limited", "e1", "c1",
                      StepState.COMMITTED, compensator="rel.refund", attempts=3)
    record = _saga(SagaState.COMPLETED, step)
    limited = [_line("charge_limited.start", "e1", step="rel.charge_limited", attempt=n)
               for n in (1, 2, 3)]
    fails = [_line("charge_limited.fail", "e1", step="rel.charge_limited", attempt=n)
             for n in (1, 2)]
    applied = [_line("charge_limited.done", "e1", step="rel.charge_limited", attempt=3)]
    assert _rules({"s1": record}, [*limited, *fails, *applied]) == []
    # a third start after a single known failure ran the body again after an unknown outcome
    assert _rules({"s1": record}, [*limited, fails[0], *applied]) == ["double-run"]


def test_a_step_recorded_failed_whose_effect_was_applied_is_reported() -> None:
    # given: run caught the charge's StepFailed, charged the backup and completed
    charge = StepRecord("rel.charge", "rel.charge", "e1", "c1", StepState.FAILED,
                        compensator="rel.refund", attempts=1, error_code="declined")
    backup = StepRecord("rel.charge-backup", "rel.charge_idem", "e2", "c2", StepState.COMMITTED,
                        compensator="rel.refund", attempts=1)
    record = _saga(SagaState.COMPLETED, charge, backup)
    ledger = [_line("charge.start", "e1", step="rel.charge"),
              _line("charge.fail", "e1", step="rel.charge"),
              _line("charge_idem.start", "e2", step="rel.charge-backup"),
              _line("charge_idem.done", "e2", step="rel.charge-backup")]
    assert _rules({"s1": record}, ledger) == []
    # the failed charge had in fact applied: an effect nothing will ever undo
    applied = _line("charge.done", "e1", step="rel.charge")
    assert _rules({"s1": record}, [*ledger, applied]) == ["failed-applied"]


def test_an_undo_whose_done_line_a_kill_cut_counts_once_by_its_dedup() -> None:
    # The attempt that refunded was killed between the provider's marker and its ledger line;
    # the next attempt found the marker: one undo, not none (and a second dedup is not two).
    step = _step("rel.charge", StepState.COMPENSATED, "e1", comp="c1")
    record = _saga(SagaState.COMPENSATED, step)
    applied = [_line("charge.start", "e1", step="rel.charge"),
               _line("charge.done", "e1", step="rel.charge")]
    cut = [_line("refund.start", "c1", step="rel.charge", undoes="e1"),
           _line("refund.start", "c1", step="rel.charge", attempt=2, undoes="e1"),
           _line("refund.dedup", "c1", step="rel.charge", attempt=2, undoes="e1")]
    assert "undo-count" not in _rules({"s1": record}, applied + cut)
    twice = [*cut, _line("refund.dedup", "c1", step="rel.charge", attempt=3, undoes="e1")]
    assert "double-undo" not in _rules({"s1": record}, applied + twice)
    assert "undo-count" not in _rules({"s1": record}, applied + twice)
