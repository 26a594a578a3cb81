"""The CI subset of the reliability suite: every fault scenario at CI size.

Each test runs real prefork workers (and beats) on a private redis-server, injects one kind of
fault while sagas run, settles, and checks every invariant from the providers' ledger and the
fence trace (``tests/reliability/invariants.py``). ``python -m tests.reliability --full``
runs the same scenarios at full size and prints the figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_sagas._records import SagaState, StepState
from tests.reliability import probes, scenarios
from tests.reliability.app import PARALLEL_UNDO_DEFINITION, STEP_NAMES
from tests.reliability.cluster import PrivatePostgres
from tests.reliability.harness import Report

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.usefixtures("redis_server")]


def _clean(report: Report) -> Report:
    assert report.violations == [] and report.problems == [], report.summary()
    return report


def test_pool_children_killed_mid_body_leave_reviews_never_double_runs(tmp_path: Path) -> None:
    report = _clean(scenarios.pool_kills(tmp_path, scenarios.CI))
    assert set(report.manual_review) <= {"ambiguous_step", "ambiguous_compensation"}, report.summary()
    assert report.outcomes["completed"] > 0


def test_inline_steps_killed_mid_body_or_mid_settle_keep_every_invariant(tmp_path: Path) -> None:
    report = _clean(scenarios.inline_kills(tmp_path, scenarios.CI))
    assert set(report.manual_review) <= {"ambiguous_step", "ambiguous_compensation"}, report.summary()
    assert report.outcomes["completed"] > 0


def test_retry_on_a_caught_step_failed_and_parallel_compensation_keep_every_invariant(
        tmp_path: Path) -> None:
    # Issue 29's options under pool-child kills (in bodies, compensators and anywhere): no
    # retry_on body ran again but after a known failure, no failed step had applied, and a
    # compensate_unknown step compensated is no blind compensation (invariants.py).
    report = _clean(scenarios.option_kills(tmp_path, scenarios.CI))
    assert set(report.manual_review) <= {"ambiguous_step", "ambiguous_compensation"}, report.summary()
    records = [r for r in report.records.values() if r is not None]
    steps = [(r, s) for r in records for s in r.steps]
    # each option was exercised: a charge retried on RateLimited then committed, and one
    # whose retries ran out; a caught failure that completed on the backup charge; a
    # declared step compensated as unknown; sagas compensated in parallel
    limited = [s for _, s in steps if s.task == STEP_NAMES["charge_limited"]]
    assert any(s.attempts > 1 and s.state is not StepState.FAILED for s in limited), report.summary()
    assert any((s.state, s.error_code) == (StepState.FAILED, "rate_limited") for s in limited), \
        report.summary()
    assert any(r.state is SagaState.COMPLETED and s.name == STEP_NAMES["charge"]
               and s.state is StepState.FAILED for r, s in steps), report.summary()
    assert any(s.outcome_unknown for _, s in steps), report.summary()
    assert any(r.definition == PARALLEL_UNDO_DEFINITION and r.state is SagaState.COMPENSATED
               for r in records), report.summary()


def test_a_whole_worker_killed_and_restarted_loses_no_saga(tmp_path: Path) -> None:
    report = _clean(scenarios.worker_kills(tmp_path, scenarios.CI))
    assert report.outcomes["lost"] == 0


def test_compensators_killed_mid_body_are_never_undone_twice(tmp_path: Path) -> None:
    report = _clean(scenarios.compensation_kills(tmp_path, scenarios.CI))
    assert report.outcomes["compensated"] > 0
    # An idempotent compensator killed on every one of its max_attempts exhausts its budget.
    reasons = {"ambiguous_step", "ambiguous_compensation", "compensation_exhausted"}
    assert set(report.manual_review) <= reasons, report.summary()


def test_the_redis_store_and_broker_killed_and_restarted_on_its_aof_loses_nothing(
    tmp_path: Path,
) -> None:
    _clean(scenarios.redis_restarts(tmp_path, scenarios.CI))


def test_the_redis_store_and_broker_killed_and_restarted_on_an_aof_fsynced_always_loses_nothing(
    tmp_path: Path,
) -> None:
    # appendfsync always: every write is on disk before its reply, so a kill loses nothing
    # acknowledged; the replies lost with the process are the faults the deliveries survive.
    report = _clean(scenarios.redis_restarts(tmp_path, scenarios.CI, "always"))
    assert report.outcomes["lost"] == 0 and report.outcomes["completed"] > 0, report.summary()


def test_a_store_stopped_past_the_socket_timeout_sends_no_saga_to_review(tmp_path: Path) -> None:
    # Claims and outcomes lose their replies; no body is judged vanished for it (0 spurious
    # reviews is the invariant; with no kill, no worker_lost or time_limit either).
    report = _clean(scenarios.store_stalls(tmp_path, scenarios.CI))
    codes = {step.error_code for record in report.records.values() if record is not None
             for step in record.steps}
    assert not codes & {"worker_lost", "time_limit"}, report.summary()
    assert report.outcomes["lost"] == 0 and report.outcomes["completed"] > 0, report.summary()


def test_a_private_postgres_stopped_immediately_and_restarted_loses_nothing(tmp_path: Path) -> None:
    if not PrivatePostgres.available():
        pytest.skip("initdb/pg_ctl are not on the PATH")
    report = _clean(scenarios.pg_crashes(tmp_path, scenarios.CI))
    assert report.faults["pg-immediate-stop"] > 0, report.summary()
    assert report.outcomes["lost"] == 0 and report.outcomes["completed"] > 0, report.summary()


def test_a_broker_restarted_empty_loses_queued_messages_and_no_saga(tmp_path: Path) -> None:
    # The broker keeps nothing: queued steps are lost with it, the sweep sends them again.
    # No body is killed, so a review is a plan's own (its body began: the invariant checks it).
    report = _clean(scenarios.broker_restarts(tmp_path, scenarios.CI))
    assert report.outcomes["lost"] == 0 and report.outcomes["completed"] > 0, report.summary()
    codes = {step.error_code for record in report.records.values() if record is not None
             for step in record.steps}
    assert not codes & {"worker_lost", "time_limit"}, report.summary()


def test_a_worker_without_the_new_key_refuses_its_steps_and_sends_no_saga_to_review(
        tmp_path: Path) -> None:
    # It takes back what it claimed and reports the record undecryptable; no claim of its is
    # judged (no worker_lost, no time_limit), and once given the key every saga settles.
    report = _clean(scenarios.key_rotation(tmp_path, scenarios.CI))
    assert report.faults["undecryptable-refusal"] > 0 and report.faults["key-given"] > 0, \
        report.summary()
    assert report.outcomes["lost"] == 0 and report.outcomes["completed"] > 0, report.summary()
    codes = {step.error_code for record in report.records.values() if record is not None
             for step in record.steps}
    assert not codes & {"worker_lost", "time_limit"}, report.summary()


def test_script_flush_mid_run_is_survived_by_reloading_the_scripts(tmp_path: Path) -> None:
    report = _clean(scenarios.script_flushes(tmp_path, scenarios.CI))
    assert report.outcomes["completed"] > 0


def test_two_beats_and_paused_sweepers_never_get_a_stale_write_accepted(tmp_path: Path) -> None:
    report = _clean(scenarios.two_beats(tmp_path, scenarios.CI))
    assert report.fences.get("writes_ok", 0) + report.fences.get("writes_refused", 0) > 0


def test_sweepers_killed_mid_sweep_have_their_buckets_taken_over_at_once(tmp_path: Path) -> None:
    # Each killed child held its bucket's sweep lease for a minute: the next sweep took it
    # over under a newer fence (traced as a grant replacing the dead one's), so every saga
    # settled without waiting for an expiry.
    report = _clean(scenarios.sweeper_kills(tmp_path, scenarios.CI))
    assert report.fences.get("takeovers", 0) >= 1, report.summary()
    assert report.outcomes["lost"] == 0 and report.outcomes["completed"] > 0, report.summary()
    assert report.settle_s is not None and report.settle_s < 30, report.summary()


def test_redis_cluster_masters_failing_over_mid_load_keep_every_invariant(tmp_path: Path) -> None:
    report = _clean(scenarios.cluster_failovers(tmp_path, scenarios.CI))
    assert report.faults["cluster-failover"] >= 2, report.summary()
    assert report.outcomes["completed"] > 0


def test_sixteen_threads_resuming_one_saga_resume_it_once(tmp_path: Path) -> None:
    _clean(probes.resume_race(tmp_path))


def test_postgres_connections_terminated_mid_run_lose_nothing(
    tmp_path: Path, postgres_url: str,
) -> None:
    report = _clean(scenarios.pg_terminations(tmp_path, scenarios.CI, postgres_url))
    assert report.faults["pg-terminate"] > 0


def test_workers_with_skewed_clocks_keep_every_invariant(tmp_path: Path) -> None:
    """One worker's engine clock runs 4 s ahead (beyond stale_after and the sweep lease).

    What happens (docs/reliability.md, "Clock skew"): the fast worker finds unclaimed steps
    stale early and sends them again (the start claim makes the duplicates no-ops); it sees
    the other sweepers' leases as expired and can take the lease while they work, so their
    renewal fails and their writes carry an older fence (refused); ``updated_at`` never goes
    backwards. A skew below time limit + grace causes no false ambiguity. Above it (the +15 s
    worker of the full run) steps still running elsewhere are judged vanished: a
    non-idempotent one goes to manual review until its body reports and settles it, an
    idempotent one is retried, late by the skew.
    """
    _clean(scenarios.clock_skew(tmp_path, scenarios.CI))


def test_a_message_delivered_again_while_its_body_runs_does_not_run_it_twice(
    tmp_path: Path,
) -> None:
    report = _clean(scenarios.visibility_redelivery(tmp_path, scenarios.CI))
    assert report.faults["redelivered-while-running"] > 0


def test_a_body_killed_by_the_hard_time_limit_is_never_guessed(tmp_path: Path) -> None:
    report = _clean(scenarios.time_limits(tmp_path, scenarios.CI))
    assert set(report.manual_review) <= {"ambiguous_step", "ambiguous_compensation"}, report.summary()


def test_a_sweeper_paused_past_its_lease_has_its_next_write_refused(tmp_path: Path) -> None:
    report = _clean(probes.paused_sweeper(tmp_path))
    assert report.fences.get("writes_refused", 0) >= 1, report.summary()


def test_lost_messages_are_re_driven_by_the_sweep(tmp_path: Path) -> None:
    report = _clean(scenarios.queue_purges(tmp_path, scenarios.CI))
    assert report.outcomes["lost"] == 0


def test_operators_cancelling_running_sagas_from_racing_threads_undo_each_effect_once(
    tmp_path: Path,
) -> None:
    report = _clean(scenarios.cancel_storm(tmp_path, scenarios.CI))
    assert report.faults["cancel"] > 0


def test_sleeping_signalled_and_parent_child_sagas_keep_every_invariant_under_kills(
        tmp_path: Path) -> None:
    report = _clean(scenarios.waiting_kills(tmp_path, scenarios.CI))
    assert report.outcomes["lost"] == 0 and report.outcomes["completed"] > 0, report.summary()
    assert set(report.manual_review) <= {"ambiguous_step", "ambiguous_compensation",
                                         "child_in_review"}, report.summary()


def test_sagas_cancelled_while_they_sleep_wait_or_hold_children_compensate_once(
        tmp_path: Path) -> None:
    report = _clean(scenarios.waiting_cancels(tmp_path, scenarios.CI))
    assert report.outcomes["compensated"] > 0 and report.outcomes["lost"] == 0, report.summary()
