"""The operator CLI as an operator runs it: real processes, real Redis broker and store.

`celery -A tests.e2e.app sagas …` goes through Celery's `celery.commands` entry point and
`celery-sagas --app tests.e2e.app …` through the console script; both find the test's store
and queue from the E2E_* environment, exactly like the workers they sit beside.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, Stack

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

BIN = Path(sys.executable).parent


def run(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a command with the test's E2E_* configuration; never waits more than a minute."""
    env = {**os.environ, **stack.config.environ(), "PYTHONPATH": str(ROOT)}
    return subprocess.run(list(args), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def celery_sagas(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`celery -A tests.e2e.app sagas ARGS`."""
    return run(stack, str(BIN / "celery"), "-A", "tests.e2e.app", "sagas", *args)


def console(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`celery-sagas --app tests.e2e.app ARGS`."""
    return run(stack, str(BIN / "celery-sagas"), "--app", "tests.e2e.app", *args)


def test_an_operator_lists_shows_and_resolves_a_saga_from_the_shell(redis_stack: Stack) -> None:
    # given: one order completed and one in manual review on a real worker
    redis_stack.worker()
    order = redis_stack.shop.order
    order.start({"sku": "A", "amount": 3, "id": "a1"}, saga_id="cli-ok")
    order.start({"sku": "B", "amount": 5, "id": "b1", "plan": {"crash": "charge"}},
                saga_id="cli-review")
    assert redis_stack.wait_settled("cli-ok").state == "completed"
    review = redis_stack.wait_settled("cli-review")
    assert review.state == "manual-review"
    charge = review.steps[1]

    # when
    listed = celery_sagas(redis_stack, "list", "--json")
    shown = console(redis_stack, "show", "cli-review")
    missing = console(redis_stack, "show", "no-such-saga")
    found = celery_sagas(redis_stack, "findings", "--json")
    no_result = console(redis_stack, "resolve", "cli-review", "--step", charge.name,
                        "--effect-id", charge.effect_id, "--committed")
    cancelled = celery_sagas(redis_stack, "cancel", "cli-ok")
    resumed_final = console(redis_stack, "resume", "cli-ok", "--json")
    resolved = console(redis_stack, "resolve", "cli-review", "--step", charge.name,
                       "--effect-id", charge.effect_id, "--committed", "--result",
                       '{"charged": 5}')
    resumed = celery_sagas(redis_stack, "resume", "cli-review")

    # then
    assert listed.returncode == 0, listed.stderr
    states = {s["saga_id"]: s["state"] for s in json.loads(listed.stdout)["sagas"]}
    assert states == {"cli-ok": "completed", "cli-review": "manual-review"}

    assert shown.returncode == 0, shown.stderr
    assert "manual-review" in shown.stdout and charge.effect_id in shown.stdout

    *before, last = missing.stderr.splitlines()
    assert (missing.returncode, last) == (3, "error: no saga 'no-such-saga'")
    # nothing else but the one warning of a store opted out of AOF (the test Redis runs without)
    assert all("append-only file" in line for line in before), missing.stderr

    assert found.returncode == 0, found.stderr
    # the saga's ambiguity is reported once; on a loaded machine a sweep may also report
    # another record (the test prints them all if so), which is not what this test is about
    findings = json.loads(found.stdout)["findings"]
    about_saga = [f["effect_id"] for f in findings if f["record_id"] == "cli-review"]
    assert about_saga == [charge.effect_id], findings

    assert no_result.returncode == 2 and "--committed needs --result" in no_result.stderr
    assert (cancelled.returncode, cancelled.stdout) == (1, "")
    assert "is completed: nothing to cancel" in cancelled.stderr
    assert (resumed_final.returncode, resumed_final.stdout) == (1, "")

    assert resolved.returncode == 0, resolved.stderr
    assert resumed.returncode == 0, resumed.stderr
    record = redis_stack.wait_settled("cli-review")
    assert record.state == "completed"
    assert record.steps[1].result == {"charged": 5}
    assert len(redis_stack.ops("charge.start", "cli-review")) == 1


def test_an_operator_exports_full_records_as_json_lines(redis_stack: Stack, tmp_path: Path) -> None:
    # given: a completed and a compensated order on a real worker
    redis_stack.worker()
    order = redis_stack.shop.order
    order.start({"sku": "A", "amount": 3, "id": "a1"}, saga_id="exp-ok")
    order.start({"sku": "B", "amount": 5, "id": "b1", "plan": {"decline": "ship"}},
                saga_id="exp-undone")
    assert redis_stack.wait_settled("exp-ok").state == "completed"
    assert redis_stack.wait_settled("exp-undone").state == "compensated"
    target = tmp_path / "export.jsonl"

    # when
    everything = celery_sagas(redis_stack, "export")
    completed = console(redis_stack, "export", "--state", "completed", "--output", str(target))

    # then: one line per saga, every field, the same as the record
    assert everything.returncode == 0, everything.stderr
    lines = [json.loads(line) for line in everything.stdout.splitlines()]
    assert sorted(r["saga_id"] for r in lines) == ["exp-ok", "exp-undone"]
    for line in lines:
        assert line == redis_stack.sagas.get(line["saga_id"]).to_dict()
    assert completed.returncode == 0 and "exported 1 sagas" in completed.stderr
    assert [json.loads(x)["saga_id"] for x in target.read_text().splitlines()] == ["exp-ok"]


def test_an_operator_reads_a_saga_history_from_the_shell(redis_stack: Stack) -> None:
    # given: an order in manual review on a real worker, resolved from the shell
    redis_stack.worker()
    redis_stack.shop.order.start({"sku": "H", "amount": 4, "id": "h1", "plan": {"crash": "charge"}},
                                 saga_id="cli-history")
    charge = redis_stack.wait_settled("cli-history").steps[1]
    resolved = celery_sagas(redis_stack, "resolve", "cli-history", "--step", charge.name,
                            "--effect-id", charge.effect_id, "--committed", "--result",
                            '{"charged": 4}', "--reason", "provider confirmed")
    assert resolved.returncode == 0, resolved.stderr
    resumed = celery_sagas(redis_stack, "resume", "cli-history", "--actor", "bob")
    assert resumed.returncode == 0, resumed.stderr
    assert redis_stack.wait_settled("cli-history").state == "completed"

    # when
    history = console(redis_stack, "history", "cli-history", "--json")
    shown = celery_sagas(redis_stack, "show", "cli-history")

    # then: the ambiguity and who settled it (the OS user, by default) stay on record
    assert history.returncode == 0, history.stderr
    entries = json.loads(history.stdout)["entries"]
    events = [e["event"] for e in entries]
    assert events.index("ambiguous") < events.index("resolve") < len(events) - 1
    [resolve] = [e for e in entries if e["event"] == "resolve"]
    assert resolve["actor"] == getpass.getuser()
    assert resolve["reason"] == "provider confirmed"
    assert shown.returncode == 0, shown.stderr
    assert "ambiguous" in shown.stdout and "provider confirmed" in shown.stdout
