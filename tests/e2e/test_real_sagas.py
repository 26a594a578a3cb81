"""What the reference saga ports needed (issue 29), on real workers: ``retry_on``,
``compensate_unknown``, ``StepFailed`` caught in ``run`` and parallel compensation.

The sagas are those of ``tests.e2e.real_sagas_app``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.e2e.conftest import ROOT, Process, Stack, wait_until
from tests.e2e.real_sagas_app import build

pytestmark = pytest.mark.e2e


@pytest.fixture
def real_stack(redis_stack: Stack) -> Stack:
    """``redis_stack`` whose client and workers load ``tests.e2e.real_sagas_app``."""
    redis_stack.shop = build(redis_stack.config)
    redis_stack.app_module = "tests.e2e.real_sagas_app"
    return redis_stack


def test_retry_on_retries_three_times_then_compensates(real_stack: Stack) -> None:
    # given: a worker, and a call the provider rate-limits on every attempt
    real_stack.worker()

    # when: the saga runs
    real_stack.shop.order.start({"sku": "L", "user": "u", "plan": {"limited": 9}},
                                saga_id="limit-1")
    record = real_stack.wait_settled("limit-1")

    # then: 1 attempt + 3 retries under one effect id, then the reservation was released
    assert (record.state, record.error_code) == ("compensated", "rate_limited")
    starts = real_stack.ops("call.start", "limit-1")
    assert [s["attempt"] for s in starts] == [1, 2, 3, 4]
    assert len({s["effect_id"] for s in starts}) == 1
    assert real_stack.ops("call.done", "limit-1") == []
    assert len(real_stack.ops("release")) == 1


def test_retry_on_recovers_when_the_limit_lifts(real_stack: Stack) -> None:
    real_stack.worker()
    real_stack.shop.order.start({"sku": "L", "user": "u", "plan": {"limited": 2}},
                                saga_id="limit-2")
    record = real_stack.wait_settled("limit-2")
    assert record.state == "completed"
    assert [s["attempt"] for s in real_stack.ops("call.start", "limit-2")] == [1, 2, 3]
    assert real_stack.ops("release") == []


def _kill(stack: Stack, kill: str, worker: Process, pid: int) -> None:
    """SIGKILL the pool child ``pid`` (``pool-child``), or the whole ``worker`` and start a
    fresh worker and beat (``whole-worker``: the sweep finds the dead claimer)."""
    if kill == "pool-child":
        os.kill(pid, signal.SIGKILL)
    else:
        worker.kill()
        stack.worker()
        stack.beat()


@pytest.mark.parametrize("kill", ["pool-child", "whole-worker"])
def test_a_compensate_unknown_step_killed_mid_body_is_compensated_exactly_once(
        real_stack: Stack, kill: str) -> None:
    # given: a worker, and a label purchase that blocks mid-body
    worker = real_stack.worker()
    plan = {"block": {"label": "go"}}
    real_stack.sagas.start("real-label", {"sku": "S", "id": "s1", "plan": plan}, saga_id="lbl-1")
    started = wait_until(lambda: real_stack.ops("label.start", "lbl-1"), what="label started")

    # when: the pool child running it is SIGKILLed (the broker requeues the message), or the
    # whole worker (a fresh worker and beat, whose sweep finds the claimer dead)
    _kill(real_stack, kill, worker, int(started[0]["pid"]))
    record = real_stack.wait_settled("lbl-1")
    real_stack.release("go")

    # then: compensated, not in review; the label cancelled once, told the outcome is unknown
    assert record.state == "compensated", (record.error_code, record.reason)
    assert record.error_code == "worker_lost" and "outcome unknown" in (record.reason or "")
    step = record.step("real.label")
    assert step is not None and (step.state, step.outcome_unknown) == ("compensated", True)
    assert len(real_stack.ops("label.start", "lbl-1")) == 1  # never re-run
    [cancel] = real_stack.ops("cancel_label", "lbl-1")
    assert (cancel["outcome"], cancel["undoes"], cancel["result"]) == (
        "unknown", step.effect_id, None)
    assert cancel["reason"] == "real.label: worker_lost"
    assert cancel["input"] == {"sku": "S", "id": "s1", "plan": plan}
    assert len(real_stack.ops("release", "lbl-1")) == 1


@pytest.mark.parametrize("kill", ["pool-child", "whole-worker"])
def test_a_caught_step_failed_then_a_worker_kill_resumes_on_the_except_path(
        real_stack: Stack, kill: str) -> None:
    # given: provider A declines; provider B's charge blocks mid-body
    worker = real_stack.worker()
    plan = {"decline": ["pay_a"], "block": {"pay_b": "go"}}
    real_stack.sagas.start("real-pay", {"sku": "P", "amount": 5, "id": "p1", "plan": plan},
                           saga_id="pay-1")
    started = wait_until(lambda: real_stack.ops("pay_b.start", "pay-1"), what="pay_b started")

    # when: the pool child running provider B is SIGKILLed (or the whole worker, then fresh
    # processes replay run: a worker and beat, whose sweep finds B's claimer dead); B answers
    _kill(real_stack, kill, worker, int(started[0]["pid"]))
    wait_until(lambda: len(real_stack.ops("pay_b.start", "pay-1")) == 2, what="pay_b retried")
    real_stack.release("go")
    record = real_stack.wait_settled("pay-1")

    # then: the replays took the except path again: B retried under its effect id, shipped
    assert record.state == "completed", (record.error_code, record.reason)
    assert record.result == {"provider": "b", "charged": 5}
    assert [s.name for s in record.steps] == [
        "tests.e2e.app.reserve", "real.pay_a", "real.pay_b", "tests.e2e.app.ship"]
    assert [s.state for s in record.steps] == ["committed", "failed", "committed", "committed"]
    assert len(real_stack.ops("pay_a.start", "pay-1")) == 1
    starts = real_stack.ops("pay_b.start", "pay-1")
    assert [s["attempt"] for s in starts] == [1, 2]
    assert {s["effect_id"] for s in starts} == {record.steps[2].effect_id}
    assert real_stack.ops("refund") == [] and real_stack.ops("release") == []


def test_parallel_compensation_runs_three_compensators_at_once_and_retries_one(
        real_stack: Stack) -> None:
    # given: a worker with room for three compensators, and beat; each compensator takes
    # 1.5 s, the car's fails once
    real_stack.worker(concurrency=4)
    real_stack.beat()  # the sweep sends a failed compensator's retry when it is due
    plan = {"decline": ["pay_a"], "unbook_ms": 1500, "unbook_failures": {"car": 1}}

    # when: the payment after the three bookings is declined
    real_stack.sagas.start("real-trip", {"amount": 9, "plan": plan}, saga_id="trip-1")
    record = real_stack.wait_settled("trip-1")

    # then: compensated; the three first attempts overlapped in time; the car's was retried
    assert (record.state, record.error_code) == ("compensated", "declined")
    starts = real_stack.ops("unbook.start", "trip-1")
    first = {s["kind"]: s for s in starts if s["attempt"] == 1}
    assert set(first) == {"flight", "hotel", "car"}
    ends = [e for e in real_stack.ledger() if e["op"] in ("unbook.done", "unbook.fail")
            and e["attempt"] == 1]
    assert max(s["t"] for s in first.values()) < min(e["t"] for e in ends), "not concurrent"
    assert sorted(s["kind"] for s in starts) == ["car", "car", "flight", "hotel"]
    assert sorted(e["kind"] for e in real_stack.ops("unbook.done", "trip-1")) == [
        "car", "flight", "hotel"]


def _dump(stack: Stack) -> dict[bytes, bytes | None]:
    """Every key of the test's Redis store with its serialized value."""
    store = stack.sagas.store
    client = store._client
    return {key: client.dump(key) for key in client.scan_iter(match=store.layout.pattern())}


def _replay_check(stack: Stack, version: int, *args: str) -> subprocess.CompletedProcess[str]:
    """`celery -A tests.e2e.real_sagas_app sagas replay-check ARGS` on code ``version``."""
    env = {**os.environ, **stack.config.environ(), "PYTHONPATH": str(ROOT),
           "E2E_CODE_VERSION": str(version)}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.e2e.real_sagas_app", "sagas",
         "replay-check", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_replay_check_finds_the_sagas_a_reordering_would_break(real_stack: Stack) -> None:
    # given: three sagas in flight on code version 1, each stopped in its charge (the worker
    # that ran them is gone), and one done
    worker = real_stack.worker(concurrency=4)
    real_stack.sagas.start("real-deploy", {"sku": "S", "amount": 1, "id": "done", "plan": {}},
                           saga_id="deploy-done")
    assert real_stack.wait_settled("deploy-done").state == "completed"
    plan = {"block": "charge", "release": "never"}
    for n in range(3):
        real_stack.sagas.start("real-deploy", {"sku": f"S{n}", "amount": n, "id": f"d{n}",
                                               "plan": plan}, saga_id=f"deploy-{n}")
    wait_until(lambda: len(real_stack.ops("charge.start")) == 4,
               what="the three blocked charges started")
    worker.kill()
    before = _dump(real_stack)

    # when: the check runs with the starting code, the reordered code and the patched code,
    # the store dumped after each run
    runs, dumps = [], []
    for version, *args in ((1, "--json"), (2,), (2, "--json", "--definition", "real-deploy"),
                           (2, "--json", "--limit", "1"), (3,)):
        runs.append(_replay_check(real_stack, version, *args))
        dumps.append(_dump(real_stack))
    same, reordered, reordered_json, limited, patched = runs

    # then: exit 0, then 1 naming each saga in flight (not the one done), then 0 again; no
    # run changed the store
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout) == {"checked": 3, "ok": True, "nondeterministic": [],
                                       "unreadable": []}
    assert reordered.returncode == 1, reordered.stderr
    for n in range(3):
        assert f"deploy-{n} (real-deploy)" in reordered.stdout
    assert "3 would become nondeterministic" in reordered.stdout
    found = json.loads(reordered_json.stdout)["nondeterministic"]
    assert sorted(d["saga_id"] for d in found) == ["deploy-0", "deploy-1", "deploy-2"]
    assert "tests.e2e.app.charge" in found[0]["reason"]
    assert limited.returncode == 1 and json.loads(limited.stdout)["checked"] == 1
    assert patched.returncode == 0, patched.stdout + patched.stderr
    assert all(dump == before for dump in dumps)
    assert "deploy-done" not in reordered.stdout
    assert [r.state for r in map(real_stack.sagas.get, ("deploy-0", "deploy-1"))] == [
        "running", "running"]
