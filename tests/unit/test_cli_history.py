"""The CLI and a saga's history (docs/design.md §2.6): ``history ID [--json]``, ``show`` keeping
what an operator settled or ended, ``--actor`` (default: the OS user) and ``--reason`` on every
acting command, the history in ``export``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from celery_sagas import SagaState
from tests.engine.conftest import Shop
from tests.unit.test_cli import ambiguous_charge, as_json, completed, plugin, running
from tests.unit.test_cli import shop as shop  # the fixture


@pytest.fixture(autouse=True)
def os_user(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr("getpass.getuser", lambda: "oncall-7")
    return "oncall-7"


def entries(shop: Shop, saga_id: str = "o-1") -> list[dict[str, Any]]:
    return list(as_json(plugin(shop, "history", saga_id, "--json"))["entries"])


def test_history_lists_each_step_in_order(shop: Shop) -> None:
    # given
    completed(shop, "o-1")

    # when
    data = as_json(plugin(shop, "history", "o-1", "--json"))
    text = plugin(shop, "history", "o-1")

    # then
    steps = [(e["event"], e["step"]) for e in data["entries"] if "step" in e]
    assert steps == [(ev, f"shop.{name}") for name in ("reserve", "charge", "ship")
                     for ev in ("intent", "claimed", "committed")]
    assert (data["saga_id"], data["folded"]) == ("o-1", 0)
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["TIME", "EVENT", "STEP", "DETAIL", "BY", "REASON"]
    assert [line.split()[1] for line in lines[1:3]] == ["created", "intent"]
    assert lines[-1].split()[1:4] == ["state", "-", "->"]


def test_resolve_records_the_actor_and_reason_and_show_keeps_the_ambiguity(shop: Shop) -> None:
    # given
    effect_id = ambiguous_charge(shop)

    # when
    resolved = plugin(shop, "resolve", "o-1", "--step", "shop.charge", "--effect-id", effect_id,
                      "--committed", "--result", '{"charge": "ch-op"}', "--actor", "alice",
                      "--reason", "provider confirmed the charge")
    shown = plugin(shop, "show", "o-1")

    # then
    assert resolved.exit_code == 0, resolved.output
    [resolve] = [e for e in entries(shop) if e["event"] == "resolve"]
    assert (resolve["actor"], resolve["reason"], resolve["state"]) == (
        "alice", "provider confirmed the charge", "committed")
    history = shown.stdout[shown.stdout.index("history ("):]
    assert "ambiguous" in history and "(step_error)" in history
    assert "alice" in history and "provider confirmed the charge" in history
    assert history.index("ambiguous") < history.index("resolve")


def test_the_actor_defaults_to_the_os_user(shop: Shop, os_user: str) -> None:
    # given
    running(shop, "o-1")

    # when
    result = plugin(shop, "cancel", "o-1")

    # then
    assert result.exit_code == 0, result.output
    [cancel] = [e for e in entries(shop) if e["event"] == "cancel"]
    assert cancel["actor"] == os_user and "reason" not in cancel


def test_show_keeps_the_approval_wait_a_cancel_ended(shop: Shop) -> None:
    # given
    shop.definitions["gated-order"].start({"id": "g-1", "sku": "s", "qty": 1, "card": "c",
                                           "total": 3}, saga_id="g-1")
    shop.driver.run_until_idle()
    shop.clock.advance(7 * 60_000)

    # when
    cancelled = plugin(shop, "cancel", "g-1", "--reason", "order withdrawn")
    shop.driver.run_until_idle()
    shown = as_json(plugin(shop, "show", "g-1", "--json"))

    # then
    assert cancelled.exit_code == 0, cancelled.output
    events = [e["event"] for e in shown["history"]["entries"]]
    assert events.index("approval_requested") < events.index("cancel")
    requested, cancel = (next(e for e in shown["history"]["entries"] if e["event"] == name)
                         for name in ("approval_requested", "cancel"))
    assert cancel["at_ms"] - requested["at_ms"] == 7 * 60_000
    assert shop.record("g-1").state is SagaState.COMPENSATED


@pytest.mark.parametrize("reason", ["two\nlines", "x" * 501])
def test_a_malformed_reason_is_a_usage_error_that_writes_nothing(shop: Shop, reason: str) -> None:
    # given
    running(shop, "o-1")
    before = shop.record("o-1")

    # when
    result = plugin(shop, "cancel", "o-1", "--reason", reason)

    # then
    assert result.exit_code == 2, result.output
    assert shop.record("o-1") == before


def test_resume_and_signal_take_an_actor_and_a_reason(shop: Shop) -> None:
    # given
    running(shop, "o-1")

    # when
    signalled = plugin(shop, "signal", "o-1", "address", "--payload", '{"street": "x"}',
                       "--signal-id", "s-1", "--actor", "crm", "--reason", "customer moved")

    # then
    assert signalled.exit_code == 0, signalled.output
    [signal] = [e for e in entries(shop) if e["event"] == "signal"]
    assert (signal["actor"], signal["reason"], signal["ref"]) == ("crm", "customer moved", "s-1")
    assert "street" not in json.dumps(entries(shop))


def test_approve_and_deny_take_an_actor_and_a_reason(shop: Shop) -> None:
    # given
    shop.definitions["gated-order"].start({"id": "g-1", "sku": "s", "qty": 1, "card": "c",
                                           "total": 3}, saga_id="g-1")
    shop.driver.run_until_idle()
    [pending] = shop.sagas.approvals.pending("g-1")

    # when
    denied = plugin(shop, "deny", pending.approval_id, "--tenant", "t1", "--actor", "boss",
                    "--reason", "not this quarter")

    # then
    assert denied.exit_code == 0, denied.output
    [deny] = [e for e in entries(shop, "g-1") if e["event"] == "deny"]
    assert (deny["actor"], deny["reason"]) == ("boss", "not this quarter")


def test_history_of_an_unknown_saga_exits_3(shop: Shop) -> None:
    result = plugin(shop, "history", "nope")
    assert result.exit_code == 3


def test_export_includes_the_history(shop: Shop) -> None:
    # given
    completed(shop, "o-1")

    # when
    result = plugin(shop, "export")

    # then
    [line] = [json.loads(x) for x in result.stdout.splitlines() if x.strip()]
    assert [e["event"] for e in line["history"]][:2] == ["created", "intent"]
    assert line["history_folded"] == 0
