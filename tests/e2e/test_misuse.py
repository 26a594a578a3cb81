"""User mistakes meet a clear error at the earliest moment, on real workers and beat
(issue 16 items 1, 6, 9): a worker refuses to start with a compensator nobody registered or
with pickle accepted; a compensator missing at run time stops the saga as ``unknown_task``
instead of a re-send every sweep; the sweep's beat entry survives ``config_from_object``; a
saga task sent with ``.delay()`` is rejected, its body not run."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_sagas._protocol import codes
from celery_sagas._records import SagaState, StepState
from tests.e2e.conftest import Process, Stack, wait_until
from tests.e2e.misuse_app import COMPENSATOR_BOOM, RUN_BOOM, STEP_BOOM, build

pytestmark = pytest.mark.e2e


@pytest.fixture
def stack(redis_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """The Redis stack running ``tests.e2e.misuse_app``; the test process has the full app."""
    redis_stack.app_module = "tests.e2e.misuse_app"
    redis_stack.shop = build(redis_stack.config)
    monkeypatch.setenv("MISUSE_VARIANT", "ok")
    yield redis_stack


def refused_worker(stack: Stack) -> Process:
    """Start a worker and wait for it to exit (it must refuse to start)."""
    process = stack._spawn(["worker", "--pool", "prefork", "-c", "1", "-Q", stack.config.queue,
                            "-n", f"w{uuid.uuid4().hex[:8]}@%h", "-l", "INFO",
                            "--without-gossip", "--without-mingle", "--without-heartbeat"],
                           "worker")
    wait_until(lambda: process.proc.poll() is not None or "ready." in process.text(),
               timeout=90, what="the worker to exit")
    assert process.proc.poll() is not None, "the worker started:\n" + process.text()[-3000:]
    assert process.proc.returncode != 0
    return process


def start(stack: Stack, saga_id: str, **plan: Any) -> None:
    stack.shop.order.start({"sku": "sku-1", "amount": 5, "note": "n", "plan": plan},
                           saga_id=saga_id)


# ---------------------------------------------------------------- item 1


@pytest.mark.parametrize(
    ("variant", "named"),
    [("typo", ("misuse.typo", "typo.name")), ("pickle-later", ("pickle",))],
    ids=["unregistered-compensator", "pickle-accepted-after-config-from-object"],
)
def test_a_worker_refuses_to_start_naming_the_cause(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, variant: str, named: tuple[str, ...]
) -> None:
    # given: an app with a step naming a compensator nobody registered (item 1), or whose
    # configuration, loaded after Sagas(app), accepts pickle (item 6)
    monkeypatch.setenv("MISUSE_VARIANT", variant)
    monkeypatch.setenv("C_FORCE_ROOT", "1")  # as root, Celery itself refuses pickle otherwise

    # when
    text = refused_worker(stack).text()

    # then
    assert all(name in text for name in named), text[-3000:]
    assert "celery_sagas: the worker refuses to start" in text


def test_a_task_no_worker_has_stops_the_saga_as_unknown_task_not_a_loop(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: the only worker on the queue is another service's, without the saga's tasks
    monkeypatch.setenv("MISUSE_VARIANT", "other")
    other = stack.worker()
    stack.beat()

    # when
    start(stack, "u-1")

    # then: manual review with unknown_task naming the task, not a re-send per sweep
    record = stack.wait_settled("u-1")
    assert (record.state, record.error_code) == (SagaState.MANUAL_REVIEW, codes.UNKNOWN_TASK)
    assert "misuse.reserve" in (record.reason or "")
    step = record.step("misuse.reserve")
    assert step is not None
    assert (step.state, step.error_code) == (StepState.EXECUTING, codes.UNKNOWN_TASK)
    sweeps = other.text().count("Task celery_sagas.sweep[")
    wait_until(lambda: other.text().count("Task celery_sagas.sweep[") >= sweeps + 6, timeout=60,
               what="three more sweeps")
    assert other.text().count("Received unregistered task of type 'misuse.reserve'") == 1

    # when: the task is deployed and the operator resumes the saga
    other.stop()
    monkeypatch.setenv("MISUSE_VARIANT", "ok")
    stack.worker()
    stack.sagas.resume("u-1")

    # then: sent again under the same effect id, and it completes
    done = stack.wait_settled("u-1")
    assert done.state == SagaState.COMPLETED
    reserved = done.step("misuse.reserve")
    assert reserved is not None and reserved.effect_id == step.effect_id


# ---------------------------------------------------------------- item 6


def test_the_sweep_still_runs_after_config_from_object_replaced_the_configuration(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: the app calls config_from_object after Sagas(app)
    monkeypatch.setenv("MISUSE_VARIANT", "config-later")
    worker = stack.worker()

    # when
    stack.beat()

    # then: beat sends the sweep and the worker runs it
    wait_until(lambda: "Task celery_sagas.sweep[" in worker.text(), timeout=60,
               what="a sweep run by the worker")


# ---------------------------------------------------------------- item 9


def test_a_saga_task_sent_with_delay_is_rejected_and_its_body_never_runs(stack: Stack) -> None:
    # given
    worker = stack.worker()

    # when: a step task is sent outside any saga
    stack.shop.tasks["reserve"].apply_async(args=("sku-1", {}), queue=stack.config.queue)

    # then
    wait_until(lambda: "arrived without saga context" in worker.text(), timeout=60,
               what="the rejection in the worker log")
    assert "ERROR" in worker.text()
    assert stack.ops("reserve.start") == []


# ---------------------------------------------------------------- items 10 and 11

MARKER = "zq-payload-marker-5c2e"  # in every input and result; never in a log line


def test_user_exceptions_reach_the_worker_log_with_tracebacks_and_show(stack: Stack) -> None:
    # given
    worker = stack.worker()

    # when: a step raises; a compensator keeps raising; run() raises
    stack.shop.order.start({"sku": "s", "amount": 5, "note": MARKER, "plan": {"charge": "crash"}},
                           saga_id="x-step")
    stack.shop.order.start({"sku": "s", "amount": 5, "note": MARKER,
                            "plan": {"charge": "decline", "release": "crash"}}, saga_id="x-comp")
    stack.shop.order.start({"sku": "s", "amount": 5, "note": MARKER, "plan": {"run": "crash"}},
                           saga_id="x-run")

    # then: each is an ERROR line with the traceback, in the worker's own log
    wait_until(lambda: all(boom in worker.text() for boom in (STEP_BOOM, COMPENSATOR_BOOM, RUN_BOOM)),
               timeout=90, what="the three exceptions in the worker log")
    text = worker.text()
    for boom in (STEP_BOOM, COMPENSATOR_BOOM, RUN_BOOM):
        at = text.index(boom)
        assert "Traceback (most recent call last)" in text[max(0, at - 3000):at]
    assert "ERROR" in text
    # ... and show prints the recorded type and message
    step_record = stack.wait_settled("x-step")
    assert step_record.step("misuse.charge").exception == f"RuntimeError: {STEP_BOOM}"
    assert stack.wait_settled("x-run").exception == f"ValueError: {RUN_BOOM}"
    shown = show(stack, "x-step")
    assert f"RuntimeError: {STEP_BOOM}" in shown


def test_a_result_json_cannot_carry_is_invalid_result_and_no_log_line_holds_a_payload(
    stack: Stack,
) -> None:
    # given
    worker = stack.worker()
    stack.beat()

    # when: a step returns a lone surrogate (its result echoes the input's marker)
    stack.shop.order.start({"sku": "s", "amount": 5, "note": MARKER,
                            "plan": {"charge": "bad_result"}}, saga_id="r-1")

    # then: invalid_result, not worker_lost; the saga waits for an operator
    record = stack.wait_settled("r-1")
    step = record.step("misuse.charge")
    assert step is not None
    assert (step.state, step.error_code) == (StepState.AMBIGUOUS, "invalid_result")
    assert record.state == SagaState.MANUAL_REVIEW

    # ... and neither the worker nor beat ever logged the payload or the record
    wait_until(lambda: "celery_sagas.sweep" in worker.text(), timeout=60, what="a sweep")
    for process in stack.processes:
        assert MARKER not in process.text()
        assert '"definition":' not in process.text()


# ---------------------------------------------------------------- issue 25 item 5


def test_a_business_code_and_an_exception_name_are_stored_as_readable_codes(stack: Stack) -> None:
    # given
    stack.worker()

    # when: one charge raises StepNotCommitted("INSUFFICIENT_CREDIT"), one a declared HTTPError
    start(stack, "c-upper", charge="decline_upper")
    start(stack, "c-http", charge="http")

    # then: each saga compensates with the code as written / the class name in snake case
    for saga_id, code in (("c-upper", "INSUFFICIENT_CREDIT"), ("c-http", "http_error")):
        record = stack.wait_settled(saga_id)
        assert record.state == SagaState.COMPENSATED
        step = record.step("misuse.charge")
        assert step is not None
        assert (step.state, step.error_code) == (StepState.FAILED, code)
        assert record.error_code == code


def show(stack: Stack, saga_id: str) -> str:
    """``celery -A <app> sagas show <id>`` as an operator runs it."""
    import os
    import subprocess
    import sys

    from tests.e2e.conftest import ROOT

    env = {**os.environ, **stack.config.environ(), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "celery", "-A", stack.app_module, "sagas",
                           "show", saga_id], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout
