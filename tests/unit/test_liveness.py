"""Who claimed an effect, and when that claimer is known to be gone: only a process this one
can see (same host, same pid namespace) is ever judged by its pid."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from celery_sagas._liveness import claim_tag, claimer_id, dead_effects
from celery_sagas._records import StepRecord, StepState
from tests.processes import unused_pid


def _claimed(claimer: str) -> StepRecord:
    return StepRecord("charge", "shop.charge", "fx-1", "cx-1", StepState.EXECUTING, attempts=1,
                      started_at_ms=1, claimed_by=claimer)


def _other_namespace_claimer() -> str:
    """The claimer id of a process in a fresh pid namespace of this host (host networking)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not available")
    code = "from celery_sagas._liveness import claimer_id; print(claimer_id())"
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    if done.returncode != 0:
        pytest.skip(f"cannot create a pid namespace here: {done.stderr.strip()[-200:]}")
    return done.stdout.strip()


def test_a_claim_by_a_dead_pid_of_this_host_is_gone() -> None:
    host = claimer_id().rpartition(":")[0]
    step = _claimed(f"{host}:{unused_pid()}/abcd")
    assert dead_effects([step]) == {"fx-1"}


def test_a_claim_of_this_process_is_never_judged_gone_by_its_pid() -> None:
    # this process is alive: a delivery of it that ended without an outcome is settled by
    # the time limit (``time_limit``), never labelled ``worker_lost``
    assert dead_effects([_claimed(claim_tag())]) == frozenset()


def test_a_claim_by_a_live_pid_of_this_host_is_not_gone() -> None:
    host = claimer_id().rpartition(":")[0]
    assert dead_effects([_claimed(f"{host}:{os.getppid()}/abcd")]) == frozenset()


def test_a_claim_of_another_host_is_never_judged() -> None:
    assert dead_effects([_claimed(f"elsewhere:{unused_pid()}/abcd")]) == frozenset()


def test_a_process_in_another_pid_namespace_of_this_host_has_another_claimer_id() -> None:
    # given: a worker in another container sharing this hostname (host networking)
    other = _other_namespace_claimer()

    # then: its pids are not ours to look up, so its claims are never judged by them
    assert other.rpartition(":")[0] != claimer_id().rpartition(":")[0]
    pid = int(other.rpartition(":")[2])
    assert dead_effects([_claimed(f"{other.rpartition(':')[0]}:{pid}/abcd")]) == frozenset()
    assert dead_effects([_claimed(f"{other.rpartition(':')[0]}:{unused_pid()}/abcd")]) == frozenset()
