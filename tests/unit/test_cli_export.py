"""``celery sagas export``: full saga records as JSON lines, filtered by the store's indexes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from celery_sagas import SagaState
from celery_sagas.cli import EXIT_USAGE
from tests.engine.conftest import ORDER, Shop
from tests.unit.test_cli import ambiguous_charge, completed, plugin, script_cli, shop  # noqa: F401



def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_export_writes_every_saga_as_one_full_json_line(shop: Shop) -> None:
    # given
    completed(shop, "o-done")
    ambiguous_charge(shop, "o-review")

    # when
    result = plugin(shop, "export", "--limit", "1")

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


def test_export_runs_as_the_console_script_too(shop: Shop) -> None:
    # given
    completed(shop, "o-1")

    # when
    result = script_cli("--app", "tests.unit.test_cli:CURRENT_APP", "export")

    # then
    assert result.exit_code == 0, result.output
    assert [r["saga_id"] for r in lines(result.stdout)] == ["o-1"]
