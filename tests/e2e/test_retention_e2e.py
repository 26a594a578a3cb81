"""Retention and archival on real workers and beat (docs/design.md §7), Redis and PostgreSQL.

Beat sends the sweep every second; the workers' retention is 3 s and their archive writes one
JSON line per record to the control directory (``tests/e2e/retention_app.py``). Final sagas
past retention are archived once, then deleted; a saga in manual review older than that
survives; while the archive raises, the saga is kept, the worker logs an ERROR and the sweep
reports an ``archive_failed`` finding naming it.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_sagas import SagaState
from tests.e2e.conftest import REDIS_BROKER, Stack, _make_stack, wait_until
from tests.files import read_json_lines

RETENTION_S = 3.0


@pytest.fixture(params=["redis", "postgres"])
def retaining(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """A Redis broker and a Redis or PostgreSQL store; workers run tests.e2e.retention_app."""
    store = request.getfixturevalue(f"{request.param}_url")
    for stack in _make_stack(tmp_path, REDIS_BROKER, store):
        stack.app_module = "tests.e2e.retention_app"
        yield stack


def archived(stack: Stack) -> list[dict[str, Any]]:
    return read_json_lines(stack.config.control / "archive.jsonl")


def start(stack: Stack, saga_id: str, **plan: Any) -> None:
    stack.shop.order.start({"sku": "S", "amount": 5, "id": saga_id, "plan": plan,
                            "card": "marker-4242"}, saga_id=saga_id)


def gone(stack: Stack, saga_id: str) -> bool:
    return stack.sagas.get(saga_id) is None


def test_retention_deletes_only_final_sagas_past_it_after_archiving_each_once(
    retaining: Stack,
) -> None:
    stack = retaining
    # given: a completed, a compensated and a manual-review saga, on real workers and beat
    stack.worker()
    stack.beat()
    start(stack, "done")
    start(stack, "undone", decline="ship")
    start(stack, "review", crash="charge")
    states = {i: stack.wait_settled(i).state for i in ("done", "undone", "review")}
    assert states == {"done": SagaState.COMPLETED, "undone": SagaState.COMPENSATED,
                      "review": SagaState.MANUAL_REVIEW}
    review = stack.sagas.get("review")

    # when: retention passes and beat keeps sweeping
    wait_until(lambda: gone(stack, "done") and gone(stack, "undone"), timeout=60,
               what="the final sagas deleted")
    past = review.updated_at_ms / 1000 + RETENTION_S + 3
    wait_until(lambda: time.time() > past, timeout=30, what="the review saga past retention")
    seen = len(stack.processes[0].text().split("sweep end"))
    buckets = stack.sagas.store.buckets  # one "sweep end" line a bucket (Redis 16, SQL 1)
    wait_until(lambda: len(stack.processes[0].text().split("sweep end")) > seen + buckets,
               timeout=60, what="another full sweep")

    # then: each final saga archived exactly once, in full, before it went
    records = archived(stack)
    assert Counter(r["saga_id"] for r in records) == {"done": 1, "undone": 1}
    by_id = {r["saga_id"]: r for r in records}
    assert by_id["done"]["state"] == "completed" and by_id["undone"]["state"] == "compensated"
    assert by_id["done"]["input"]["card"] == "marker-4242"
    assert [s["state"] for s in by_id["done"]["steps"]] == ["committed"] * 3
    # and the saga in manual review, older than retention, is untouched
    assert stack.sagas.get("review") == review


def test_a_raising_archive_keeps_the_saga_logs_an_error_and_reports_archive_failed(
    retaining: Stack,
) -> None:
    stack = retaining
    # given: the archive is down
    (stack.config.control / "archive-down").touch()
    worker = stack.worker()
    stack.beat()
    start(stack, "kept")
    assert stack.wait_settled("kept").state is SagaState.COMPLETED

    # when: retention passes; every sweep tries and fails to archive it
    finding = re.compile(r"ERROR.*finding archive_failed: saga kept\b")
    wait_until(lambda: finding.search(worker.text()), timeout=60,
               what="an archive_failed finding naming the saga")

    # then: kept, an ERROR line names it (the exception type, never its text or the payload)
    assert stack.sagas.get("kept") is not None
    assert re.search(r"ERROR.*archive failed for saga kept \(ArchiveDown\)", worker.text())
    assert "record of kept not written" not in worker.text()
    assert "marker-4242" not in worker.text()
    assert archived(stack) == []

    # and: once the archive is back the saga is archived once and deleted
    (stack.config.control / "archive-down").unlink()
    wait_until(lambda: gone(stack, "kept"), timeout=60, what="the saga deleted")
    assert [r["saga_id"] for r in archived(stack)] == ["kept"]
