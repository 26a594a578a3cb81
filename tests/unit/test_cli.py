"""The operator CLI (`celery sagas …` and `celery-sagas --app …`) against a Sagas on MemoryStore.

Sagas are put into states with the engine tests' shop and a SagaDriver; every command is run
through click's CliRunner, as the Celery plugin (with Celery's CLIContext) or as the console
script (loading the app by import path from ``CURRENT_APP`` below).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from celery import Celery
from celery.bin.base import CLIContext
from celery.bin.celery import celery as celery_root
from click.testing import CliRunner, Result

from celery_sagas import MemoryStore, Sagas, SagaState, StepState
from celery_sagas._approvals.ledger import ApprovalLedger
from celery_sagas._celery.facade import sagas_of
from celery_sagas._cli_format import finding_hint, iso
from celery_sagas._leases import Leases
from celery_sagas._protocol.findings import Finding, FindingKind
from celery_sagas._records import Binding
from celery_sagas._sweep import SWEEP_LEASE
from celery_sagas.cli import (
    COMMANDS,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    exit_code,
    main,
    sagas,
)
from celery_sagas.errors import (
    ApprovalDecisionError,
    InvalidRecordError,
    SagaConfigurationError,
    SagaNotFound,
    SagaResolutionError,
    SagaValidationError,
    StoreError,
)
from celery_sagas.testing import FrozenClock
from celery_sagas.testing.driver import SagaDriver
from tests.engine.conftest import ORDER, Script, Shop, register_shop

# The console-script tests load the app by import path: tests.unit.test_cli:CURRENT_APP.
CURRENT_APP: Celery | None = None
LAZY_APP: Celery | None = None
APP_PATH = f"{__name__}:CURRENT_APP"
STALE_MS = 30_000
SECRET = b"cli-test-secret-of-at-least-32-bytes!"


class BrokenStore(MemoryStore):
    """A store whose reads fail as a lost Redis connection would (translated to StoreError)."""

    def get(self, kind: str, record_id: str) -> Any:
        raise StoreError("redis get failed: ConnectionError: connection refused")


@pytest.fixture
def shop() -> Iterator[Shop]:
    """The engine tests' shop on a fresh app, published as CURRENT_APP for --app."""
    global CURRENT_APP
    app = Celery(f"cli-{uuid.uuid4().hex[:8]}", set_as_current=False)
    clock = FrozenClock()
    facade = Sagas(app, store=MemoryStore(), allow_non_durable=True, clock=clock,
                   approval_secrets=[SECRET])
    driver = SagaDriver(facade)
    script = Script()
    tasks, definitions = register_shop(facade, script)

    @facade.saga("gated-order")
    def gated_order(ctx: Any, order: dict[str, Any]) -> Any:
        ctx.step(tasks["reserve"], order["sku"], order["qty"])
        ctx.approval("manager-ok", capability="orders.approve", tenant_id="t1", principal_id="p1")
        return ctx.step(tasks["charge"], order["card"], order["total"])

    definitions["gated-order"] = gated_order
    CURRENT_APP = app
    yield Shop(facade, driver, clock, script, tasks, definitions)
    CURRENT_APP = None


def plugin(shop: Shop, *args: str) -> Result:
    """Run `celery sagas ARGS` as Celery would: with its CLIContext holding the app."""
    obj = CLIContext(app=shop.sagas.app, no_color=True, workdir=None)
    return CliRunner().invoke(sagas, list(args), obj=obj)


def script_cli(*args: str) -> Result:
    """Run the `celery-sagas` console script."""
    return CliRunner().invoke(main, list(args))


def as_json(result: Result) -> Any:
    """The command's JSON output (it must have succeeded)."""
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def completed(shop: Shop, saga_id: str) -> None:
    shop.start_order(saga_id, id=saga_id)
    shop.driver.run_until_idle()


def ambiguous_charge(shop: Shop, saga_id: str = "o-1") -> str:
    """An order in manual review: charge's connection dropped after the request left."""
    shop.script.then("charge", ConnectionError("reset after the request left"))
    shop.start_order(saga_id, id=saga_id)
    shop.driver.run_until_idle()
    assert shop.record(saga_id).state == SagaState.MANUAL_REVIEW
    return shop.step("shop.charge", saga_id).effect_id


def running(shop: Shop, saga_id: str) -> None:
    """An order whose reserve step is dispatched but not delivered."""
    shop.start_order(saga_id, id=saga_id)
    assert shop.record(saga_id).state == SagaState.RUNNING


# ------------------------------------------------------------ list


def test_list_shows_every_saga_with_its_state(shop: Shop) -> None:
    # given
    completed(shop, "o-done")
    ambiguous_charge(shop, "o-review")

    # when
    result = plugin(shop, "list")

    # then
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split()[2] for line in result.stdout.splitlines()[1:]}
    assert lines == {"o-done": "completed", "o-review": "manual-review"}


def test_list_json_carries_no_input_or_results(shop: Shop) -> None:
    # given
    completed(shop, "o-done")

    # when
    data = as_json(plugin(shop, "list", "--json"))

    # then
    [saga] = data["sagas"]
    assert (saga["saga_id"], saga["state"], saga["steps"]) == ("o-done", "completed", 3)
    assert "input" not in saga and "result" not in json.dumps(data)
    assert ORDER["card"] not in json.dumps(data)


def test_list_filters_by_state_and_definition(shop: Shop) -> None:
    # given
    completed(shop, "o-done")
    ambiguous_charge(shop, "o-review")
    shop.notify_user.start({"user": "u-1"}, saga_id="n-1")
    shop.driver.run_until_idle()

    # when
    by_state = as_json(plugin(shop, "list", "--state", "manual-review", "--json"))
    by_definition = as_json(plugin(shop, "list", "--definition", "notify-user", "--json"))

    # then
    assert [s["saga_id"] for s in by_state["sagas"]] == ["o-review"]
    assert [s["saga_id"] for s in by_definition["sagas"]] == ["n-1"]


def test_list_by_definition_filters_in_the_store_one_page_at_a_time(
    shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: many orders, three notify-user sagas among them
    for n in range(12):
        completed(shop, f"o-{n}")
    for n in range(3):
        shop.notify_user.start({"user": f"u-{n}"}, saga_id=f"n-{n}")
    shop.driver.run_until_idle()
    store = shop.sagas.store
    scans: list[dict[str, Any]] = []
    inner = store.scan

    def counted(kind: str, states: Any, **options: Any) -> Any:
        page = inner(kind, states, **options)
        scans.append({**options, "items": len(page.items)})
        return page

    monkeypatch.setattr(store, "scan", counted)

    # when
    first = as_json(plugin(shop, "list", "--definition", "notify-user", "--limit", "2", "--json"))
    rest = as_json(plugin(shop, "list", "--definition", "notify-user", "--limit", "2",
                          "--cursor", first["cursor"], "--json"))

    # then: one label scan per page, reading only that definition's sagas
    assert [s["saga_id"] for s in first["sagas"] + rest["sagas"]] == ["n-0", "n-1", "n-2"]
    assert rest["cursor"] is None
    assert [(s["label"], s["limit"], s["items"]) for s in scans] == [
        ("notify-user", 2, 2), ("notify-user", 2, 1)]


def test_list_pages_with_limit_and_cursor(shop: Shop) -> None:
    # given
    for n in range(5):
        completed(shop, f"o-{n}")

    # when
    first = as_json(plugin(shop, "list", "--limit", "3", "--json"))
    rest = as_json(plugin(shop, "list", "--limit", "3", "--cursor", first["cursor"], "--json"))

    # then
    seen = [s["saga_id"] for s in first["sagas"] + rest["sagas"]]
    assert sorted(seen) == [f"o-{n}" for n in range(5)]
    assert len(first["sagas"]) == 3 and rest["cursor"] is None


def test_list_rejects_an_unknown_state_as_a_usage_error(shop: Shop) -> None:
    # when
    result = plugin(shop, "list", "--state", "sleeping")

    # then
    assert result.exit_code == EXIT_USAGE


# ------------------------------------------------------------ show


def test_show_prints_the_steps_as_a_timeline_with_effect_ids(shop: Shop) -> None:
    # given
    effect_id = ambiguous_charge(shop)

    # when
    result = plugin(shop, "show", "o-1")

    # then
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "manual-review (ambiguous_step)" in text
    assert " 1. shop.reserve  committed" in text and " 2. shop.charge  ambiguous" in text
    assert effect_id in text
    assert shop.step("shop.reserve").compensation_effect_id in text
    assert ORDER["card"] not in text  # no payloads without --payload


def compensated_reserve(shop: Shop) -> tuple[int, int, int]:
    """o-1 cancelled after reserve committed: (commit, compensator claim, compensated) times."""
    running(shop, "o-1")
    committed_at = shop.clock.advance(1_000)
    shop.deliver_next()  # reserve commits, charge is sent
    shop.clock.advance(60_000)
    shop.sagas.cancel("o-1")
    claimed_at = shop.clock.advance(5_000)
    shop.driver.run_until_idle()
    assert shop.record().state == SagaState.COMPENSATED
    reserve = shop.step("shop.reserve")
    assert reserve.committed_at_ms == committed_at and reserve.compensation is not None
    return committed_at, claimed_at, reserve.compensation.at_ms


def test_show_keeps_forward_and_compensation_times_apart(shop: Shop) -> None:
    # given: reserve committed, then was compensated a minute later
    committed_at, claimed_at, compensated_at = compensated_reserve(shop)

    # when
    text = plugin(shop, "show", "o-1").stdout
    data = as_json(plugin(shop, "show", "o-1", "--json"))

    # then: the forward line reads forward; the compensator's start is on its own line
    lines = text.splitlines()
    effect = next(line for line in lines if shop.step("shop.reserve").effect_id in line)
    compensation = lines[lines.index(effect) + 1]
    assert "started" not in effect and f"committed {iso(committed_at)}" in effect
    assert compensation.strip().startswith("compensation")
    assert f"started {iso(claimed_at)}" in compensation
    assert f"compensated {iso(compensated_at)}" in compensation
    [reserve] = [s for s in data["steps"] if s["name"] == "shop.reserve"]
    assert (reserve["started_at_ms"], reserve["committed_at_ms"]) == (None, committed_at)
    assert reserve["compensation_started_at_ms"] == claimed_at
    assert reserve["compensated_at_ms"] == compensated_at


def test_show_prints_the_exception_a_step_raised_with_its_message(shop: Shop) -> None:
    # given: charge raised ConnectionError("reset after the request left")
    ambiguous_charge(shop)

    # when
    text = plugin(shop, "show", "o-1").stdout
    view = as_json(plugin(shop, "show", "o-1", "--json"))

    # then
    assert "    raised        ConnectionError: reset after the request left" in text
    assert view["steps"][1]["exception"] == "ConnectionError: reset after the request left"
    assert view["steps"][0]["exception"] is None


def test_show_prints_the_exception_run_raised_on_one_line(shop: Shop) -> None:
    # given: run() raised with a message that tries to forge a second line
    @shop.sagas.saga("crashing")
    def crashing(ctx: Any, data: Any) -> Any:
        raise TypeError("bad total\nsaga        forged")

    crashing.start({}, saga_id="c-1")

    # when
    text = plugin(shop, "show", "c-1").stdout
    view = as_json(plugin(shop, "show", "c-1", "--json"))

    # then
    assert "manual-review (run_failed)" in text
    assert "raised      TypeError: bad total\\nsaga        forged" in text
    assert "\nsaga        forged" not in text
    assert view["exception"] == "TypeError: bad total\nsaga        forged"


def test_show_prints_where_a_step_and_run_raised_one_frame_a_line(shop: Shop) -> None:
    # given: charge raised (in the test's Script), and run() raised in ``crashing``
    ambiguous_charge(shop)

    @shop.sagas.saga("crashing")
    def crashing(ctx: Any, data: Any) -> Any:
        raise TypeError("bad total")

    crashing.start({}, saga_id="c-2")

    # when
    step_text = plugin(shop, "show", "o-1").stdout.splitlines()
    run_text = plugin(shop, "show", "c-2").stdout.splitlines()
    view = as_json(plugin(shop, "show", "o-1", "--json"))

    # then
    at = next(n for n, line in enumerate(step_text) if line.startswith("    where         "))
    assert step_text[at - 1].startswith("    raised        ConnectionError")
    frames = view["steps"][1]["traceback"].splitlines()
    assert [line.strip() for line in step_text[at:at + len(frames)]] == \
        [f"where         {frames[0]}", *frames[1:]]
    assert frames[-1].startswith("engine/conftest.py:")
    where = [line for line in run_text if line.startswith("where       ")]
    assert len(where) == 1 and run_text[-1] != where[0]
    assert any(line.strip().endswith(" in crashing") for line in run_text)


def test_show_payload_adds_the_input_and_arguments(shop: Shop) -> None:
    # given
    completed(shop, "o-1")

    # when
    result = plugin(shop, "show", "o-1", "--payload")

    # then
    assert result.exit_code == 0
    assert ORDER["card"] in result.stdout and '"reservation":"r-sku-1"' in result.stdout


def test_show_json_has_step_results_but_no_input_unless_asked(shop: Shop) -> None:
    # given
    completed(shop, "o-1")

    # when
    plain = as_json(plugin(shop, "show", "o-1", "--json"))
    full = as_json(plugin(shop, "show", "o-1", "--json", "--payload"))

    # then
    assert plain["steps"][0]["result"] == {"reservation": "r-sku-1"}
    assert "input" not in plain and "args" not in plain["steps"][0]
    assert full["input"]["card"] == ORDER["card"]
    assert full["steps"][1]["args"] == [ORDER["card"], ORDER["total"]]
    assert [s["state"] for s in plain["steps"]] == ["committed"] * 3


def test_show_an_unknown_saga_exits_3_with_one_line(shop: Shop) -> None:
    # when
    result = plugin(shop, "show", "nope")

    # then
    assert result.exit_code == EXIT_NOT_FOUND
    assert result.stderr == "error: no saga 'nope'\n"
    assert result.stdout == ""


def test_show_an_invalid_saga_id_is_a_usage_error(shop: Shop) -> None:
    # when
    result = plugin(shop, "show", "has space")

    # then
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith("error: saga id")


# ------------------------------------------------------------ findings


def test_findings_name_the_ambiguous_step_and_how_to_resolve_it(shop: Shop) -> None:
    # given
    effect_id = ambiguous_charge(shop)
    completed(shop, "o-done")

    # when
    data = as_json(plugin(shop, "findings", "--json"))
    text = plugin(shop, "findings").stdout

    # then
    [finding] = data["findings"]
    assert (finding["kind"], finding["record_id"], finding["step"], finding["effect_id"]) == (
        "ambiguous-execution", "o-1", "shop.charge", effect_id)
    assert f"resolve o-1 --step shop.charge --effect-id {effect_id}" in finding["hint"]
    assert "o-done" not in text and effect_id in text


def test_findings_report_a_running_saga_only_once_it_is_stale(shop: Shop) -> None:
    # given
    running(shop, "o-slow")
    fresh = as_json(plugin(shop, "findings", "--report", "sagas", "--json"))

    # when
    shop.clock.advance(STALE_MS + 1)
    stale = as_json(plugin(shop, "findings", "--report", "sagas", "--json"))

    # then
    assert fresh["findings"] == []
    assert [(f["record_id"], f["kind"]) for f in stale["findings"]] == [
        ("o-slow", "ambiguous-execution")]
    assert "sweep" in stale["findings"][0]["hint"]


def test_findings_page_with_a_cursor_and_cover_the_effects(shop: Shop) -> None:
    # given: a step sent and never claimed, long ago
    running(shop, "o-slow")
    shop.clock.advance(STALE_MS + 1)

    # when
    first = as_json(plugin(shop, "findings", "--limit", "1", "--json"))
    rest = as_json(plugin(shop, "findings", "--cursor", first["cursor"], "--json"))
    effects = as_json(plugin(shop, "findings", "--report", "effects", "--json"))

    # then
    reserve = shop.step("shop.reserve", "o-slow").effect_id
    assert [f["kind"] for f in first["findings"]] == ["ambiguous-execution"]
    assert [(f["kind"], f["record_id"]) for f in rest["findings"]] == [("incomplete", reserve)]
    assert rest["cursor"] is None
    assert effects["findings"] == rest["findings"]


def test_findings_refuse_a_forged_cursor(shop: Shop) -> None:
    # when
    result = plugin(shop, "findings", "--cursor", "not-a-cursor")

    # then
    assert (result.exit_code, result.stderr) == (EXIT_USAGE, "error: malformed findings cursor\n")


def test_findings_say_so_when_nothing_needs_an_operator(shop: Shop) -> None:
    # given
    completed(shop, "o-1")

    # when
    result = plugin(shop, "findings")

    # then
    assert (result.exit_code, result.stdout) == (0, "no findings: nothing needs an operator\n")


# ------------------------------------------------------------ resolve, resume, cancel


def test_resolve_committed_then_resume_completes_the_saga(shop: Shop) -> None:
    # given
    effect_id = ambiguous_charge(shop)

    # when
    resolved = plugin(shop, "resolve", "o-1", "--step", "shop.charge", "--effect-id", effect_id,
                      "--committed", "--result", '{"charge": "ch-op"}')
    resumed = plugin(shop, "resume", "o-1")
    shop.driver.run_until_idle()

    # then
    assert resolved.exit_code == 0, resolved.output
    assert "now running" in resolved.stdout
    assert resumed.exit_code == 0, resumed.output
    assert shop.step("shop.charge").result == {"charge": "ch-op"}
    assert shop.record().state == SagaState.COMPLETED


def test_resolve_not_committed_records_the_error_code_and_compensates(shop: Shop) -> None:
    # given
    effect_id = ambiguous_charge(shop)

    # when
    data = as_json(plugin(shop, "resolve", "o-1", "--step", "shop.charge", "--effect-id",
                          effect_id, "--not-committed", "--error-code", "card_declined", "--json"))
    shop.sagas.resume("o-1")
    shop.driver.run_until_idle()

    # then
    assert data["state"] == "compensating"
    charge = shop.step("shop.charge")
    assert (charge.state, charge.error_code) == (StepState.FAILED, "card_declined")
    assert shop.record().state == SagaState.COMPENSATED


def test_resolve_with_a_stale_effect_id_is_refused_and_changes_nothing(shop: Shop) -> None:
    # given
    ambiguous_charge(shop)
    before = shop.record()

    # when
    result = plugin(shop, "resolve", "o-1", "--step", "shop.charge", "--effect-id", "old-effect",
                    "--committed", "--result", "{}")

    # then
    assert result.exit_code == EXIT_REFUSED
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert shop.record() == before


@pytest.mark.parametrize(
    "flags",
    [[], ["--committed", "--not-committed"], ["--committed", "--result", "{nope"],
     ["--not-committed", "--result", "{}"], ["--compensated", "--error-code", "x"]],
    ids=["no-outcome", "two-outcomes", "bad-json", "result-without-committed",
         "code-without-not-committed"],
)
def test_resolve_usage_errors_exit_2_and_change_nothing(shop: Shop, flags: list[str]) -> None:
    # given
    effect_id = ambiguous_charge(shop)
    before = shop.record()

    # when
    result = plugin(shop, "resolve", "o-1", "--step", "shop.charge", "--effect-id", effect_id, *flags)

    # then
    assert result.exit_code == EXIT_USAGE, result.output
    assert shop.record() == before


def test_resolve_committed_without_a_result_is_a_usage_error(shop: Shop) -> None:
    # given: an ambiguous charge (storing null would run the saga on with a wrong result)
    effect_id = ambiguous_charge(shop)
    before = shop.record()

    # when
    result = plugin(shop, "resolve", "o-1", "--step", "shop.charge", "--effect-id", effect_id,
                    "--committed")

    # then
    assert result.exit_code == EXIT_USAGE, result.output
    assert "--committed needs --result" in result.stderr
    assert shop.record() == before


def test_resolve_committed_with_result_null_stores_null(shop: Shop) -> None:
    # given
    effect_id = ambiguous_charge(shop)

    # when
    result = plugin(shop, "resolve", "o-1", "--step", "shop.charge", "--effect-id", effect_id,
                    "--committed", "--result", "null")

    # then
    assert result.exit_code == 0, result.output
    charge = shop.step("shop.charge")
    assert (charge.state, charge.result) == (StepState.COMMITTED, None)


def test_resolve_an_unknown_saga_exits_3(shop: Shop) -> None:
    # when
    result = plugin(shop, "resolve", "nope", "--step", "s", "--effect-id", "e", "--compensated")

    # then
    assert (result.exit_code, result.stderr) == (EXIT_NOT_FOUND, "error: no saga 'nope'\n")


def test_resume_is_refused_while_an_outcome_is_unknown(shop: Shop) -> None:
    # given
    ambiguous_charge(shop)

    # when
    result = plugin(shop, "resume", "o-1")

    # then
    assert result.exit_code == EXIT_REFUSED
    assert "resolve it first (resume refused)" in result.stderr


def test_cancel_compensates_what_committed(shop: Shop) -> None:
    # given
    running(shop, "o-1")
    shop.deliver_next()  # reserve commits, charge is sent

    # when
    data = as_json(plugin(shop, "cancel", "o-1", "--json"))
    shop.driver.run_until_idle()

    # then
    assert data["saga_id"] == "o-1"
    assert shop.record().state == SagaState.COMPENSATED
    assert "release" in shop.script.names()


@pytest.mark.parametrize("command", ["cancel", "resume"])
def test_cancel_and_resume_of_a_completed_saga_are_refused(shop: Shop, command: str) -> None:
    # given
    completed(shop, "o-1")
    before = shop.record()

    # when
    result = plugin(shop, command, "o-1")

    # then
    assert result.exit_code == EXIT_REFUSED, result.output
    assert result.stdout == ""
    assert result.stderr == f"error: saga 'o-1' is completed: nothing to {command} ({command} refused)\n"
    assert shop.record() == before


@pytest.mark.parametrize("command", ["cancel", "resume"])
def test_cancel_and_resume_of_a_compensated_saga_are_refused_in_json_too(shop: Shop,
                                                                           command: str) -> None:
    # given
    running(shop, "o-1")
    shop.deliver_next()
    shop.sagas.cancel("o-1")
    shop.driver.run_until_idle()
    assert shop.record().state == SagaState.COMPENSATED

    # when
    result = plugin(shop, command, "o-1", "--json")

    # then
    assert (result.exit_code, result.stdout) == (EXIT_REFUSED, "")
    assert f"is compensated: nothing to {command}" in result.stderr


@pytest.mark.parametrize("command", ["cancel", "resume"])
def test_cancel_and_resume_of_an_unknown_saga_exit_3(shop: Shop, command: str) -> None:
    # when
    result = plugin(shop, command, "nope")

    # then
    assert (result.exit_code, result.stderr) == (EXIT_NOT_FOUND, "error: no saga 'nope'\n")


def test_signal_records_the_payload_once_per_signal_id(shop: Shop) -> None:
    # given
    running(shop, "o-1")

    # when
    for _ in range(2):
        data = as_json(plugin(shop, "signal", "o-1", "paid", "--payload", '{"amount": 5}',
                              "--signal-id", "hook-1", "--json"))

    # then
    assert data["saga_id"] == "o-1"
    assert [(s.signal_id, s.name, s.payload) for s in shop.record().signals] == [
        ("hook-1", "paid", {"amount": 5})]


def test_show_lists_signals_without_their_payloads_unless_asked(shop: Shop) -> None:
    # given
    running(shop, "o-1")
    plugin(shop, "signal", "o-1", "paid", "--payload", '{"card": "4242"}', "--signal-id", "h-1")

    # when
    text = plugin(shop, "show", "o-1").stdout
    data = as_json(plugin(shop, "show", "o-1", "--json"))
    full = as_json(plugin(shop, "show", "o-1", "--json", "--payload"))

    # then
    assert "signal      paid h-1" in text and "not received yet" in text and "4242" not in text
    assert data["signals"][0]["signal_id"] == "h-1" and "4242" not in json.dumps(data)
    assert full["signals"][0]["payload"] == {"card": "4242"}


def test_signal_of_an_unknown_saga_exits_3(shop: Shop) -> None:
    # when
    result = plugin(shop, "signal", "nope", "paid")

    # then
    assert result.exit_code == EXIT_NOT_FOUND


def test_signal_with_a_payload_that_is_not_json_is_a_usage_error(shop: Shop) -> None:
    # given
    running(shop, "o-1")

    # when
    result = plugin(shop, "signal", "o-1", "paid", "--payload", "{nope")

    # then
    assert result.exit_code == 2 and "--payload" in result.stderr
    assert shop.record().signals == ()


# ------------------------------------------------------------ approvals


def ledger(shop: Shop) -> ApprovalLedger:
    return ApprovalLedger(shop.sagas.store, shop.clock)


def pending_approval(shop: Shop, approval_id: str = "ap-1") -> None:
    ledger(shop).create(
        approval_id=approval_id, effect_id="eff-1",
        binding=Binding(capability="payments.refund", tenant_id="t1", principal_id="p1"),
        token_hash="0" * 64, ttl_ms=60_000,
    )


@pytest.mark.parametrize(("command", "state"), [("approve", "approved"), ("deny", "denied")])
def test_approve_and_deny_decide_a_pending_approval_once(shop: Shop, command: str, state: str) -> None:
    # given
    pending_approval(shop)

    # when
    first = as_json(plugin(shop, command, "ap-1", "--tenant", "t1", "--by", "alice", "--json"))
    again = plugin(shop, command, "ap-1", "--tenant", "t1", "--by", "bob")

    # then
    assert (first["state"], first["decided_by"]) == (state, "alice")
    assert "token_hash" not in first
    assert again.exit_code == EXIT_REFUSED
    stored = ledger(shop).get("ap-1")
    assert stored is not None and stored.decided_by == "alice"


def test_an_approval_of_another_tenant_is_refused(shop: Shop) -> None:
    # given
    pending_approval(shop)

    # when
    result = plugin(shop, "approve", "ap-1", "--tenant", "t2", "--by", "alice")

    # then
    assert result.exit_code == EXIT_REFUSED
    stored = ledger(shop).get("ap-1")
    assert stored is not None and str(stored.state) == "pending"


def test_denying_a_saga_gate_compensates_what_came_before(shop: Shop) -> None:
    # given
    shop.definitions["gated-order"].start(ORDER, saga_id="g-1")
    shop.driver.run_until_idle()
    gate = shop.step("manager-ok", "g-1")
    assert gate.state == StepState.AWAITING_APPROVAL and gate.approval_id is not None
    assert gate.approval_id in plugin(shop, "show", "g-1").stdout

    # when
    result = plugin(shop, "deny", gate.approval_id, "--tenant", "t1", "--by", "carol")
    shop.driver.run_until_idle()

    # then
    assert result.exit_code == 0, result.output
    assert result.stdout == f"approval {gate.approval_id} denied by carol\n"
    assert shop.record("g-1").state == SagaState.COMPENSATED
    assert shop.script.names() == ["reserve", "release"]


def test_approving_the_gate_of_a_cancelled_saga_is_refused(shop: Shop) -> None:
    # given
    shop.definitions["gated-order"].start(ORDER, saga_id="g-1")
    shop.driver.run_until_idle()
    gate = shop.step("manager-ok", "g-1")
    assert gate.approval_id is not None
    plugin(shop, "cancel", "g-1")
    shop.driver.run_until_idle()

    # when
    result = plugin(shop, "approve", gate.approval_id, "--tenant", "t1", "--by", "carol")

    # then
    assert result.exit_code == EXIT_REFUSED, result.output
    assert "its gate no longer waits" in result.stderr
    approval = shop.sagas.approvals.get(gate.approval_id)
    assert approval is not None and approval.state == "pending"


def test_approving_an_unknown_approval_exits_3(shop: Shop) -> None:
    # when
    result = plugin(shop, "approve", "nope", "--tenant", "t1", "--by", "alice")

    # then
    assert result.exit_code == EXIT_NOT_FOUND
    assert result.stderr == "error: no approval 'nope'\n"


# ------------------------------------------------------------ sweep


def test_sweep_prints_its_report_and_drives_stale_sagas(shop: Shop) -> None:
    # given: reserve was sent but the message was lost
    running(shop, "o-1")
    shop.driver.take()
    shop.clock.advance(STALE_MS + 1)

    # when
    data = as_json(plugin(shop, "sweep", "--json"))
    shop.driver.run_until_idle()

    # then
    assert (data["acquired"], data["complete"], data["acted"]) == (True, True, 1)
    assert data["examined"] >= 1
    assert shop.record().state == SagaState.COMPLETED


def test_sweep_text_reports_manual_review_findings(shop: Shop) -> None:
    # given
    effect_id = ambiguous_charge(shop)

    # when
    result = plugin(shop, "sweep")

    # then
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("sweep complete under fence")
    assert effect_id in result.stdout


def test_sweep_is_refused_while_another_sweeper_holds_the_lease(shop: Shop) -> None:
    # given
    held = Leases(shop.sagas.store, shop.clock, owner="other-host:1").acquire(SWEEP_LEASE, 60_000)
    assert held is not None

    # when
    result = plugin(shop, "sweep")

    # then
    assert result.exit_code == EXIT_REFUSED
    assert "another sweeper holds the lease" in result.stdout


def test_a_sweep_that_could_not_lease_every_bucket_says_so_and_exits_1() -> None:
    # given: a store of four buckets, another sweeper holding bucket 2 (issue 25 item 13: on
    # Redis, whose store has many buckets, such a sweep printed "stopped early (lease lost)"
    # and exited 0)
    app = Celery(f"cli-{uuid.uuid4().hex[:8]}", set_as_current=False)
    clock = FrozenClock()
    facade = Sagas(app, store=MemoryStore(buckets=4), allow_non_durable=True, clock=clock)
    held = Leases(facade.store, clock, owner="other-host:1").acquire(SWEEP_LEASE, 60_000, bucket=2)
    assert held is not None

    # when
    obj = CLIContext(app=app, no_color=True, workdir=None)
    text = CliRunner().invoke(sagas, ["sweep"], obj=obj)
    data = CliRunner().invoke(sagas, ["sweep", "--json"], obj=obj)

    # then: the buckets it could lease were swept; the one it could not is named, no lease lost
    assert text.exit_code == EXIT_REFUSED, text.output
    assert "lease lost" not in text.stdout
    assert "swept 3 of 4 buckets" in text.stdout and "another sweeper holds" in text.stdout
    assert data.exit_code == EXIT_REFUSED, data.output
    report = json.loads(data.stdout)
    assert (report["complete"], report["lease_lost"]) == (False, False)


def test_a_sweep_that_lost_its_lease_exits_1_as_documented(
    shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a stale saga, and a lease that cannot be renewed (another sweeper took it over)
    # (issue 25 item 13: it printed "stopped early" and exited 0)
    running(shop, "o-1")
    shop.driver.take()
    shop.clock.advance(STALE_MS + 1)
    monkeypatch.setattr(shop.sagas.store, "renew_lease", lambda *args, **kwargs: None)

    # when
    result = plugin(shop, "sweep")

    # then
    assert "stopped early (lease lost)" in result.stdout
    assert result.exit_code == EXIT_REFUSED


def test_sweep_exits_4_when_the_pass_met_errors(shop: Shop, monkeypatch: pytest.MonkeyPatch) -> None:
    # given: a stale saga, and a store whose fenced writes fail (as a cross-slot write did on
    # Redis Cluster)
    running(shop, "o-1")
    shop.driver.take()
    shop.clock.advance(STALE_MS + 1)
    store = shop.sagas.store
    plain = store.compare_and_set

    def failing(envelope: Any, expected_version: int, *, fence: Any = None) -> bool:
        if fence is not None:
            raise StoreError("redis cas failed: ClusterCrossSlotError")
        return plain(envelope, expected_version, fence=fence)

    monkeypatch.setattr(store, "compare_and_set", failing)

    # when
    result = plugin(shop, "sweep")

    # then
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert "errors 1" in result.stdout


# ------------------------------------------------------------ errors and entry points


def test_a_store_failure_exits_4_with_one_line() -> None:
    # given
    app = Celery(f"cli-{uuid.uuid4().hex[:8]}", set_as_current=False)
    Sagas(app, store=BrokenStore(), allow_non_durable=True)

    # when
    result = CliRunner().invoke(sagas, ["show", "o-1"], obj=CLIContext(app, True, None))

    # then
    assert result.exit_code == EXIT_UNAVAILABLE
    assert result.stderr == "error: redis get failed: ConnectionError: connection refused\n"


def test_an_app_without_sagas_is_a_usage_error() -> None:
    # given
    app = Celery(f"bare-{uuid.uuid4().hex[:8]}", set_as_current=False)

    # when
    result = CliRunner().invoke(sagas, ["list"], obj=CLIContext(app, True, None))

    # then
    assert result.exit_code == EXIT_USAGE
    assert "no Sagas(app, ...) was created" in result.stderr


def test_sagas_created_in_a_task_module_are_found_after_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: an app whose Sagas is created by a module listed in app.conf.imports
    global LAZY_APP
    module = f"lazy_sagas_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from celery_sagas import MemoryStore, Sagas\n"
        "from tests.unit.test_cli import LAZY_APP\n"
        "sagas = Sagas(LAZY_APP, store=MemoryStore(), allow_non_durable=True)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    LAZY_APP = Celery(f"lazy-{uuid.uuid4().hex[:8]}", set_as_current=False)
    LAZY_APP.conf.imports = (module,)

    # when
    result = CliRunner().invoke(sagas, ["list", "--json"], obj=CLIContext(LAZY_APP, True, None))

    # then
    assert as_json(result)["sagas"] == []
    assert sagas_of(LAZY_APP) is sys.modules[module].sagas


def test_sagas_of_finds_the_sagas_created_on_an_app(shop: Shop) -> None:
    # then
    assert sagas_of(shop.sagas.app) is shop.sagas
    with pytest.raises(SagaConfigurationError):
        sagas_of(Celery("other", set_as_current=False))


def test_the_console_script_loads_the_app_by_import_path(shop: Shop) -> None:
    # given
    completed(shop, "o-1")

    # when
    data = as_json(script_cli("--app", APP_PATH, "show", "o-1", "--json"))

    # then
    assert data["state"] == "completed"


def test_the_console_script_reads_the_app_from_the_environment(shop: Shop) -> None:
    # given
    completed(shop, "o-1")

    # when
    result = CliRunner().invoke(main, ["list"], env={"CELERY_SAGAS_APP": APP_PATH})

    # then
    assert result.exit_code == 0, result.output
    assert "o-1" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [(["list"], "--app"), (["--app", "no_such_module_xyz", "list"], "cannot load app")],
    ids=["no-app", "unknown-module"],
)
def test_the_console_script_needs_a_loadable_app(args: list[str], message: str) -> None:
    # when
    result = script_cli(*args)

    # then
    assert result.exit_code == EXIT_USAGE
    assert message in result.stderr


def test_celery_finds_the_plugin_through_its_entry_point(shop: Shop) -> None:
    # given
    completed(shop, "o-1")

    # when
    result = CliRunner().invoke(celery_root, ["-A", APP_PATH, "sagas", "list", "--json"])

    # then
    assert [s["saga_id"] for s in as_json(result)["sagas"]] == ["o-1"]


def test_every_command_takes_json_and_is_on_both_entry_points() -> None:
    # then
    for command in COMMANDS:
        assert "as_json" in [p.name for p in command.params], command.name
        assert sagas.commands[command.name or ""] is command
        assert main.commands[command.name or ""] is command
    assert set(sagas.commands) == {"list", "show", "history", "findings", "replay-check", "resolve",
                                   "approve", "deny", "cancel", "resume", "signal", "sweep",
                                   "reseal", "reindex", "export", "web"}
    assert sagas.commands["web"] is main.commands["web"]
    assert sagas.commands["export"] is main.commands["export"]  # JSON lines, always


@pytest.mark.parametrize(
    ("error", "code"),
    [(SagaNotFound(saga_id="x"), 3), (SagaValidationError("bad"), 2),
     (SagaConfigurationError("no"), 2), (StoreError("down"), 4),
     (InvalidRecordError(kind="saga", record_id="x"), 4), (SagaResolutionError("no"), 1),
     (ApprovalDecisionError("no"), 1), (RuntimeError("bug"), None)],
)
def test_errors_map_to_exit_codes(error: Exception, code: int | None) -> None:
    # then
    assert exit_code(error) == code


def test_an_unexpected_error_is_not_hidden(shop: Shop, monkeypatch: pytest.MonkeyPatch) -> None:
    # given
    def explode(saga_id: str) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(shop.sagas, "get", explode)

    # when
    result = plugin(shop, "show", "o-1")

    # then
    assert isinstance(result.exception, RuntimeError)
    assert result.exit_code == 1


def test_help_lists_every_command() -> None:
    # when
    result = CliRunner().invoke(sagas, ["--help"])

    # then
    assert result.exit_code == 0
    for name in ("list", "show", "findings", "resolve", "approve", "deny", "cancel", "resume",
                 "sweep"):
        assert f"  {name} " in result.stdout
    assert isinstance(sagas, click.Group)


# ------------------------------------------------------------ hints true per code


def review_finding(code: str, step: str | None = None, effect: str | None = None) -> Finding:
    return Finding(FindingKind.MANUAL_REVIEW, "saga", "o-1", "manual-review", step, effect, code)


def test_the_hint_of_a_nondeterministic_review_says_deploy_then_resume_or_cancel() -> None:
    hint = finding_hint(review_finding("nondeterministic"))
    assert "replays the recorded steps" in hint and hint.endswith("resume o-1 | cancel o-1")
    assert "provider" not in hint


def test_the_hint_of_an_exhausted_compensation_says_resume_gives_a_fresh_budget() -> None:
    hint = finding_hint(review_finding("compensation_exhausted", "shop.reserve", "cx-1"))
    assert "fresh budget" in hint
    assert "resolve o-1 --step shop.reserve --effect-id cx-1 --compensated" in hint


@pytest.mark.parametrize("code", ["run_failed", "invalid_step_call", "invalid_retry_policy",
                                  "payload_too_large", "made_up_code"])
def test_every_review_hint_ends_with_resume_or_cancel(code: str) -> None:
    hint = finding_hint(review_finding(code))
    assert hint.endswith("resume o-1 | cancel o-1") and "provider" not in hint


def test_findings_of_an_exhausted_compensation_name_the_step(shop: Shop) -> None:
    # given: a cancelled order whose release compensator fails every time
    running(shop, "o-1")
    shop.deliver_next()
    for _ in range(10):
        shop.script.then("release", RuntimeError("warehouse down"))
    shop.sagas.cancel("o-1")
    for _ in range(10):
        shop.clock.advance(600_000)
        shop.driver.run_until_idle()
        shop.sagas.sweep()
    assert shop.record().error_code == "compensation_exhausted"

    # when
    found = as_json(plugin(shop, "findings", "--json"))["findings"]
    [finding] = [f for f in found if f["record_kind"] == "saga"]

    # then
    reserve = shop.step("shop.reserve")
    assert (finding["step"], finding["effect_id"]) == ("shop.reserve",
                                                       reserve.compensation_effect_id)
    assert "fresh budget" in finding["hint"]
# ------------------------------------------------------------ export


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_export_writes_every_saga_as_one_full_json_line(shop: Shop) -> None:
    # given
    completed(shop, "o-done")
    ambiguous_charge(shop, "o-review")

    # when
    result = plugin(shop, "export")

    # then: every field, payloads included, identical to the record
    assert result.exit_code == 0, result.output
    exported = {r["saga_id"]: r for r in lines(result.stdout)}
    assert set(exported) == {"o-done", "o-review"}
    assert exported["o-done"] == shop.record("o-done").to_dict()
    assert exported["o-done"]["input"]["card"] == ORDER["card"]
    assert exported["o-done"]["steps"][0]["result"] == {"reservation": "r-sku-1"}
    assert exported["o-review"]["state"] == "manual-review"


def test_export_filters_by_states_definition_and_time(shop: Shop) -> None:
    # given: two sagas now, one an hour later, one of another definition
    completed(shop, "o-early")
    ambiguous_charge(shop, "o-review")
    shop.clock.advance(3_600_000)
    completed(shop, "o-late")
    shop.notify_user.start({"user": "u-1"}, saga_id="n-1")
    shop.driver.run_until_idle()

    # when
    final = plugin(shop, "export", "--state", "completed,compensated")
    early = plugin(shop, "export", "--before", "2023-11-14T22:30:00Z")
    early_naive = plugin(shop, "export", "--before", "2023-11-14T22:30:00")
    early_offset = plugin(shop, "export", "--before", "2023-11-14T23:30:00+01:00")
    orders = plugin(shop, "export", "--definition", "place-order", "--state", "completed")

    # then
    assert sorted(r["saga_id"] for r in lines(final.stdout)) == ["n-1", "o-early", "o-late"]
    for result in (early, early_naive, early_offset):
        assert sorted(r["saga_id"] for r in lines(result.stdout)) == ["o-early", "o-review"]
    assert sorted(r["saga_id"] for r in lines(orders.stdout)) == ["o-early", "o-late"]


def test_export_to_a_file_says_how_many_it_wrote(shop: Shop, tmp_path: Path) -> None:
    # given
    for n in range(3):
        completed(shop, f"o-{n}")
    target = tmp_path / "sagas.jsonl"

    # when
    result = plugin(shop, "export", "--output", str(target))

    # then
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "exported 3 sagas" in result.stderr
    assert [r["state"] for r in lines(target.read_text())] == [str(SagaState.COMPLETED)] * 3


def test_export_refuses_bad_states_and_times_as_usage_errors(shop: Shop) -> None:
    # when / then
    assert plugin(shop, "export", "--state", "completed,sleeping").exit_code == EXIT_USAGE
    assert plugin(shop, "export", "--before", "yesterday").exit_code == EXIT_USAGE
    assert plugin(shop, "export", "--definition", "has space").exit_code == EXIT_USAGE


def test_export_limit_is_a_total_as_in_list(shop: Shop) -> None:
    # given (issue 25 item 9: --limit 2 exported every saga, a page size)
    for n in range(5):
        completed(shop, f"o-{n}")

    # when
    two = plugin(shop, "export", "--limit", "2")
    every = plugin(shop, "export")

    # then
    assert two.exit_code == 0, two.output
    assert [r["saga_id"] for r in lines(two.stdout)] == ["o-0", "o-1"]
    assert len(lines(every.stdout)) == 5


@pytest.mark.parametrize("where", ["/proc/nope/x.jsonl", "{tmp}/missing-dir/x.jsonl"])
def test_export_to_a_path_that_cannot_be_written_is_a_usage_error(
    shop: Shop, tmp_path: Path, where: str
) -> None:
    # given
    completed(shop, "o-1")

    # when
    result = plugin(shop, "export", "--output", where.format(tmp=tmp_path))

    # then: exit 2 naming --output, no traceback
    assert result.exit_code == EXIT_USAGE, result.output
    assert "--output" in result.output and "cannot write" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def sealed_without_the_key(shop: Shop) -> Shop:
    """The shop's sagas on an encrypting app, read by an app that has no key (same store)."""
    from cryptography.fernet import Fernet

    store = shop.sagas.store
    writer = Sagas(Celery(f"w-{uuid.uuid4().hex[:8]}", set_as_current=False), store=store,
                   allow_non_durable=True, clock=shop.clock,
                   encryption_keys=[Fernet.generate_key()])
    register_shop(writer, shop.script)
    SagaDriver(writer)
    writer.start("place-order", ORDER, saga_id="sealed-1")
    return shop


def test_export_refuses_a_saga_no_key_decrypts_and_writes_no_file(shop: Shop, tmp_path: Path) -> None:
    # given: a saga sealed with a key this process does not list (issue 25 item 9: it wrote
    # "input": "<encrypted>" as data and exited 0)
    completed(shop, "o-1")
    sealed_without_the_key(shop)
    target = tmp_path / "out.jsonl"

    # when
    result = plugin(shop, "export", "--output", str(target))

    # then
    assert result.exit_code == EXIT_REFUSED, result.output
    assert "sealed-1" in result.stderr and "--keep-sealed" in result.stderr
    assert not target.exists() and list(tmp_path.iterdir()) == []
    assert "<encrypted>" not in plugin(shop, "export").stdout


def test_export_keep_sealed_writes_the_sealed_form_as_a_marked_object(shop: Shop) -> None:
    # given
    completed(shop, "o-1")
    sealed_without_the_key(shop)

    # when
    result = plugin(shop, "export", "--keep-sealed")

    # then: the readable saga as usual; the sealed one as a "sealed" object, no placeholder
    assert result.exit_code == 0, result.output
    exported = {r["saga_id"]: r for r in lines(result.stdout)}
    assert exported["o-1"] == shop.record("o-1").to_dict()
    sealed = exported["sealed-1"]
    assert "input" not in sealed and "<encrypted>" not in result.stdout
    assert (sealed["definition"], sealed["state"]) == ("place-order", "running")
    assert isinstance(sealed["sealed"]["body"]["sealed"], str)  # the Fernet token
    assert sealed["sealed"]["body"]["input"] is None


def test_export_runs_as_the_console_script_too(shop: Shop) -> None:
    # given
    completed(shop, "o-1")

    # when
    result = script_cli("--app", APP_PATH, "export")

    # then
    assert result.exit_code == 0, result.output
    assert [r["saga_id"] for r in lines(result.stdout)] == ["o-1"]


def test_reindex_reports_nothing_to_add_on_a_store_reading_its_primary_key(shop: Shop) -> None:
    completed(shop, "o-done")

    result = plugin(shop, "reindex", "--json")

    assert result.exit_code == 0, result.output
    assert as_json(result) == {"indexed": 0}


def test_list_sorts_by_last_write_across_states_and_pages_in_that_order(shop: Shop) -> None:
    # given: o-a completed, then o-b in review, then o-c completed, a minute apart
    completed(shop, "o-a")
    shop.clock.advance(60_000)
    ambiguous_charge(shop, "o-b")
    shop.clock.advance(60_000)
    completed(shop, "o-c")

    # when
    first = as_json(plugin(shop, "list", "--sort", "newest", "--limit", "2", "--json"))
    rest = as_json(plugin(shop, "list", "--sort", "newest", "--limit", "2", "--json",
                          "--cursor", first["cursor"]))
    oldest = as_json(plugin(shop, "list", "--sort", "oldest", "--json"))
    by_state = as_json(plugin(shop, "list", "--json"))

    # then
    assert [s["saga_id"] for s in first["sagas"] + rest["sagas"]] == ["o-c", "o-b", "o-a"]
    assert rest["cursor"] is None
    assert [s["saga_id"] for s in oldest["sagas"]] == ["o-a", "o-b", "o-c"]
    ids = [s["saga_id"] for s in by_state["sagas"]]
    assert abs(ids.index("o-a") - ids.index("o-c")) == 1  # by default state by state
    assert plugin(shop, "list", "--sort", "sideways").exit_code == 2


def test_list_sorts_by_creation_which_a_later_write_does_not_change(shop: Shop) -> None:
    # given: c-a then c-b created in review a minute apart, then c-a resolved (written last)
    effect_id = ambiguous_charge(shop, "c-a")
    shop.clock.advance(60_000)
    ambiguous_charge(shop, "c-b")
    shop.clock.advance(60_000)
    resolved = plugin(shop, "resolve", "c-a", "--step", "shop.charge", "--effect-id", effect_id,
                      "--committed", "--result", '{"charge": "ch-op"}')
    assert resolved.exit_code == 0, resolved.output

    # when
    created = as_json(plugin(shop, "list", "--sort", "newest-created", "--limit", "1", "--json"))
    rest = as_json(plugin(shop, "list", "--sort", "newest-created", "--limit", "1", "--json",
                          "--cursor", created["cursor"]))
    oldest = as_json(plugin(shop, "list", "--sort", "oldest-created", "--json"))
    written = as_json(plugin(shop, "list", "--sort", "newest", "--json"))

    # then
    assert [s["saga_id"] for s in created["sagas"] + rest["sagas"]] == ["c-b", "c-a"]
    assert [s["saga_id"] for s in oldest["sagas"]] == ["c-a", "c-b"]
    assert [s["saga_id"] for s in written["sagas"]] == ["c-a", "c-b"]
