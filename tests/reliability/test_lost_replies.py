"""Deterministic repros of lost store replies on real workers (docs/guarantees.md, "Every review
label is true"): the store's own redis-server is SIGSTOPped for longer than the clients' socket
timeout while a step claims, or while a step's outcome is written, then SIGCONTed; or a proxy
in front of it forwards a claim or an outcome write (applied) and drops its reply. The saga
must complete with every body run once and nothing sent to review. No beat runs: the delivery
itself must see the saga on, not a sweep.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import wait_until
from tests.reliability.app import DEFINITION
from tests.reliability.cluster import Cluster, PrivateRedis, make_cluster, new_tag
from tests.reliability.proxy import ReplyLosingProxy
from tests.reliability.recording import read_lines

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.usefixtures("redis_server")]

SOCKET_TIMEOUT_S = 1
STALL_S = 4.0  # well past the socket timeout, well within the steps' time limit
# A delivery that waited past half its time limit begins no body and leaves the step to the
# sweep (no beat runs here): a limit long enough for a loaded machine's recovery.
TIME_LIMIT_S = 120.0


Stack = tuple[Cluster, PrivateRedis, ReplyLosingProxy]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """A worker on a private broker, its store on a redis-server of its own (so the store can
    be stopped while the broker answers), reached through a proxy that can lose a reply."""
    server = PrivateRedis(tmp_path / f"store-{new_tag()}").start()
    proxy = ReplyLosingProxy(server.port).start()
    try:
        cluster = make_cluster(tmp_path / "cluster",
                               store=f"redis://127.0.0.1:{proxy.port}/1?socket_timeout={SOCKET_TIMEOUT_S}",
                               time_limit=TIME_LIMIT_S)
    except BaseException:
        proxy.close()
        server.close()
        raise
    try:
        cluster.worker(concurrency=1)
        yield cluster, server, proxy
    finally:
        server.resume()
        cluster.close()
        proxy.close()
        server.close()


def _start(cluster: Cluster, saga_id: str, plan: dict[str, Any]) -> None:
    cluster.sagas.start(DEFINITION, {"sku": "sku-1", "amount": 5, "id": "o-1", "plan": plan},
                        saga_id=saga_id)


def _completed_once(cluster: Cluster, saga_id: str) -> None:
    record = wait_until(lambda: _settled(cluster, saga_id), timeout=90,
                        what=f"saga {saga_id} settled\n{cluster.logs()}")
    assert str(record.state) == "completed", (record.state, record.error_code, cluster.logs())
    starts = [line["op"] for line in read_lines(cluster.config.ledger)
              if line["op"].endswith(".start") and line["saga_id"] == saga_id]
    assert sorted(starts) == ["charge.start", "reserve.start", "ship.start"], starts
    assert [step.attempts for step in record.steps] == [1, 1, 1]


def _warmed_up(cluster: Cluster) -> None:
    """Run one saga first: the store's scripts are loaded (a request the server answers with
    NOSCRIPT would not be applied, so its lost reply would prove nothing)."""
    _start(cluster, "warm-up", {})
    _completed_once(cluster, "warm-up")


def _settled(cluster: Cluster, saga_id: str) -> Any:
    try:
        record = cluster.sagas.get(saga_id)
    except Exception:
        return None
    return record if record is not None and str(record.state) != "running" else None


def test_a_claim_sent_while_the_store_is_stopped_runs_its_body_once_and_completes(
        stack: Stack) -> None:
    # given: the worker consumes nothing while the saga starts, so its first claim is the
    # first thing it sends once the store is stopped
    cluster, server, _ = stack
    control = cluster.shop.app.control
    worker = [cluster.workers[0][0].name]  # its reply ends the wait (not the whole timeout)
    control.cancel_consumer(cluster.config.queue, destination=worker, reply=True, timeout=10)
    _start(cluster, "claim-1", {})
    server.pause()
    try:
        control.add_consumer(cluster.config.queue, destination=worker, reply=True, timeout=10)
        wait_until(lambda: "did not answer the claim" in cluster.logs(), timeout=30,
                   what="the claim to time out")
        time.sleep(STALL_S)
    finally:
        server.resume()

    # then: the claim's body ran once and the saga completed, with no review
    _completed_once(cluster, "claim-1")


def test_an_outcome_written_while_the_store_is_stopped_counts_and_the_next_step_goes_out(
        stack: Stack) -> None:
    # given: reserve runs for a second; the store stops while it runs
    cluster, server, _ = stack
    _start(cluster, "outcome-1", {"sleep": {"reserve": 1000}})
    wait_until(lambda: any(line["op"] == "reserve.start"
                           for line in read_lines(cluster.config.ledger)),
               timeout=30, what="reserve to start")
    server.pause()
    try:
        time.sleep(SOCKET_TIMEOUT_S + STALL_S)
    finally:
        server.resume()

    # then: the outcome was recorded once (never "moved on"), charge went out from the same
    # delivery (no beat runs here), and the saga completed
    _completed_once(cluster, "outcome-1")
    assert "moved on; outcome" not in cluster.logs(tail=10**7)


@pytest.mark.parametrize(("marker", "logged"), [
    # the first claim note: the delivery finds its own claim, takes it back and claims again
    (b'"claim":[', "own claim found after a lost reply"),
    # the first write of a committed step (reserve's outcome): recognised as applied by its
    # write id, and charge is sent by the same delivery (no beat runs here)
    (b"committed", None),
], ids=["claim", "outcome"])
def test_a_write_applied_whose_reply_was_lost_is_recognised_and_the_saga_completes(
        stack: Stack, marker: bytes, logged: str | None) -> None:
    # given: the write reaches the store, its reply does not
    cluster, _, proxy = stack
    _warmed_up(cluster)
    proxy.lose_reply_to(marker)

    # when
    _start(cluster, "lost-1", {})

    # then
    _completed_once(cluster, "lost-1")
    assert proxy.lost == [marker]
    logs = cluster.logs(tail=10**7)
    assert "moved on; outcome" not in logs
    assert logged is None or logged in logs
