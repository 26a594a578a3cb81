"""Fault injectors: each is ``(cluster, rng, log) -> None`` and logs what it did.

Kills aimed "in a body" read the providers' ledger for bodies that started and have not
finished, and SIGKILL the pool child running one (checked to be our pool child right before).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, text

from celery_sagas.errors import SagaError
from tests.e2e.conftest import Process
from tests.redis_cluster import NODE_TIMEOUT_S, RedisCluster
from tests.reliability.cluster import Cluster, PrivatePostgres, PrivateRedis, children_of
from tests.reliability.harness import FaultLog, Injector
from tests.reliability.recording import read_lines

_FINISHED = (".done", ".dedup", ".fail", ".nothing")


class LedgerTail:
    """Bodies that started and have not finished yet, read incrementally from the ledger."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.open: dict[tuple[str, str, int], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def running(self, ops: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Ledger ``.start`` lines of bodies still running (optionally of some ops only)."""
        with self._lock:
            self._read()
            wanted = None if ops is None else set(ops)
            return [line for (op, _, _), line in self.open.items() if wanted is None or op in wanted]

    def _read(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for raw in complete.decode(errors="replace").splitlines():
            if not raw.strip():
                continue
            line = json.loads(raw)
            op, _, phase = line["op"].partition(".")
            key = (op, line["effect_id"], line["attempt"])
            if phase == "start":
                self.open[key] = line
            elif f".{phase}" in _FINISHED:
                self.open.pop(key, None)


def kill_in_body(ops: Iterable[str] | None = None, kind: str = "kill-child-in-body") -> Injector:
    """SIGKILL the pool child running a started, unfinished body (of ``ops``)."""
    tails: dict[Path, LedgerTail] = {}
    chosen = None if ops is None else tuple(ops)

    def inject(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
        tail = tails.setdefault(cluster.config.ledger, LedgerTail(cluster.config.ledger))
        candidates = tail.running(chosen)
        rng.shuffle(candidates)
        for line in candidates:
            # Read the ledger again right before the signal: the body may just have ended.
            if line in tail.running(chosen) and cluster.kill_child(line["pid"]):
                log.add(kind, f"{line['op']} {line['effect_id']} pid {line['pid']}", line)
                return

    return inject


def cancel_running(racers: int = 4) -> Injector:
    """An operator cancels a saga whose body is running, from ``racers`` threads at once."""
    tails: dict[Path, LedgerTail] = {}

    def inject(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
        tail = tails.setdefault(cluster.config.ledger, LedgerTail(cluster.config.ledger))
        running = tail.running(("reserve", "charge", "charge_idem", "ship"))
        if not running:
            return
        saga_id = rng.choice(running)["saga_id"]
        barrier = threading.Barrier(racers)
        outcomes: list[str] = []

        def cancel() -> None:
            barrier.wait()
            try:
                outcomes.append(str(cluster.sagas.cancel(saga_id).state))
            except SagaError as exc:
                outcomes.append(type(exc).__name__)

        threads = [threading.Thread(target=cancel) for _ in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        log.add("cancel", f"{saga_id}: {sorted(outcomes)}")

    return inject


def cancel_waiting(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
    """An operator cancels a saga held by a timer, a signal wait or a child saga."""
    try:
        page = cluster.sagas.browse(states=["running"], limit=200)
    except SagaError:
        return
    held = [r.saga_id for r in page.records if any(s.state == "waiting" for s in r.steps)]
    if not held:
        return
    saga_id = rng.choice(held)
    try:
        outcome = str(cluster.sagas.cancel(saga_id).state)
    except SagaError as exc:
        outcome = type(exc).__name__
    log.add("cancel-waiting", f"{saga_id}: {outcome}")


def kill_random_child(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
    """SIGKILL any pool child (it may be idle, advancing, sweeping or in a body)."""
    children = sorted(cluster.pool_children())
    if children:
        pid = rng.choice(children)
        if cluster.kill_child(pid):
            log.add("kill-child", f"pid {pid}")


def kill_worker_and_restart(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
    """SIGKILL a whole worker (main process and pool), then start a fresh one like it."""
    live = cluster.live_workers()
    if not live:
        return
    process, env = rng.choice(live)
    cluster.retire(process)
    pool = children_of(process.pid)  # killed with it: their claims are the fault's
    process.kill()
    log.add("kill-worker", f"pid {process.pid} children {' '.join(map(str, pool))}".rstrip())
    cluster.worker(env=env)


def lagging_key_rollout(keyed: dict[str, str], keyless: dict[str, str],
                        hold: tuple[float, float]) -> Injector:
    """A key rotation one worker missed: a worker running with ``keyless`` (an environment
    without the key records are sealed with) is stopped (warm shutdown) and started again with
    ``keyed``; when none runs, a keyed worker is first restarted with ``keyless`` and left to
    receive steps for ``hold`` seconds. Every episode ends with the key given."""

    def restart(cluster: Cluster, process: Process, env: dict[str, str]) -> None:
        cluster.retire(process)
        warm_stop(process)
        cluster.worker(env=env)

    def inject(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
        live = cluster.live_workers()
        lagging = [process for process, env in live if env == keyless]
        if not lagging:
            candidates = [p for p, env in live if env == keyed]
            if not candidates:
                return
            process = rng.choice(candidates)
            restart(cluster, process, keyless)
            log.add("keyless-worker", f"pid {process.pid} restarted without the new key")
            time.sleep(rng.uniform(*hold))
            lagging = [p for p, env in cluster.live_workers() if env == keyless]
        for process in lagging:
            restart(cluster, process, keyed)
            log.add("key-given", f"pid {process.pid} restarted with the new key")

    return inject


def warm_stop(process: Process, timeout: float = 60.0) -> None:
    """SIGTERM a worker's main process alone (Celery's warm shutdown: running bodies finish,
    reserved messages go back to the queue), then kill what is left after ``timeout``."""
    if process.proc.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.proc.wait(timeout=timeout)
    process.kill()


def restart_redis(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
    """SIGKILL the private redis-server (store and broker) and start it again on its AOF."""
    assert cluster.redis is not None
    cluster.redis.kill()
    log.add("redis-sigkill")
    time.sleep(rng.uniform(0.2, 1.5))  # the outage: clients see connection refused meanwhile
    cluster.redis.start()


def restart_broker(server: PrivateRedis) -> Injector:
    """SIGKILL the broker's redis-server (no AOF, no snapshot: it keeps nothing) and start it
    again empty after 0.2-1.5 s: every message queued is lost, and so is the record of the
    ones workers reserved. Logs how many messages the queue held when it died."""

    def inject(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
        queued = queued_messages(server, cluster.config.queue)
        server.kill()
        log.add("broker-restart", f"{queued} queued lost")
        time.sleep(rng.uniform(0.2, 1.5))  # clients see connection refused meanwhile
        server.start()

    return inject


def queued_messages(server: PrivateRedis, queue: str) -> int:
    """Messages waiting in ``queue`` on a Redis broker (every priority list of kombu's), or 0
    when the server does not answer."""
    client = redis.Redis.from_url(f"{server.url}/0", socket_timeout=2)
    try:
        return sum(int(client.llen(key)) for key in client.scan_iter(match=f"{queue}*")
                   if client.type(key) in (b"list", "list"))
    except redis.RedisError:
        return 0
    finally:
        client.close()


def stall_store(server: PrivateRedis, seconds: tuple[float, float]) -> Injector:
    """SIGSTOP the store's redis-server for ``seconds`` (longer than the clients' socket
    timeout), then SIGCONT: claims and outcomes sent meanwhile lose their replies, and land (or
    not) when it resumes."""

    def inject(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
        pause = rng.uniform(*seconds)
        server.pause()
        log.add("store-sigstop", f"{pause:.1f}s")
        try:
            time.sleep(pause)
        finally:
            server.resume()

    return inject


def crash_postgres(server: PrivatePostgres) -> Injector:
    """``pg_ctl stop -m immediate`` the store's PostgreSQL (transactions in flight are lost or
    committed without a reply), then start it again after 0.3-1.5 s (crash recovery)."""

    def inject(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
        server.crash()
        log.add("pg-immediate-stop")
        try:
            time.sleep(rng.uniform(0.3, 1.5))
        finally:
            server.start()

    return inject


def cluster_failover(nodes: RedisCluster, *, kill: bool) -> Injector:
    """Fail one master of a Redis Cluster store over to its replica.

    ``kill=False``: ``CLUSTER FAILOVER`` on the replica (a manual failover: the replica
    catches up with its master first, then takes its slots). ``kill=True``: SIGKILL the
    master; the replica is promoted once the others judge the master failed
    (cluster-node-timeout), then the killed node is started again and rejoins as a replica.
    A shard whose nodes took part in a failover less than 2 x cluster-node-timeout ago is left
    alone: Redis 7.0 does not hold a new election for such a node, and a manual failover
    then flips back at once (seen in this scenario).
    """
    rested = 2 * NODE_TIMEOUT_S + 0.5
    last: dict[int, float] = {}

    def inject(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
        now = time.monotonic()
        shards = [(m, nodes.replica_of(m)) for m in nodes.masters()]
        ready = [(m, r) for m, r in shards
                 if now - max(last.get(m, 0.0), last.get(r, 0.0)) > rested]
        if not ready:
            return
        master, replica = rng.choice(ready)
        if kill:
            nodes.kill(master)
            log.add("master-sigkill", f"master {master}, replica {replica}")
        else:
            nodes.failover(replica)
            log.add("cluster-failover", f"replica {replica} takes over from {master}")
        nodes.wait_master(replica, timeout=30)
        if kill:
            nodes.start_node(master)
        # The old master replicates its successor before the next fault.
        nodes.wait_replica(master, timeout=30)
        last[master] = last[replica] = time.monotonic()

    return inject


def purge_queue(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
    """Drop every message waiting in the run's queue (a broker that lost them)."""
    with cluster.shop.app.connection_for_write() as connection:
        dropped = connection.default_channel.queue_purge(cluster.config.queue)
    log.add("queue-purge", f"{dropped} messages")


def script_flush(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
    """Empty the store server's Lua script cache (the next EVALSHA gets NOSCRIPT)."""
    client = redis.Redis.from_url(cluster.config.store)
    try:
        client.script_flush()
    finally:
        client.close()
    log.add("script-flush")


def terminate_backends(application_name: str) -> Injector:
    """``pg_terminate_backend`` every connection of this run (by application_name)."""
    engines: dict[str, Any] = {}

    def inject(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
        url = cluster.config.store.split("?", 1)[0]
        engine = engines.setdefault(url, create_engine(url, isolation_level="AUTOCOMMIT",
                                                       pool_size=1))
        with engine.connect() as conn:
            killed = conn.execute(text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = 'test' AND application_name = :name AND pid <> pg_backend_pid()"
            ), {"name": application_name}).scalar_one()
        log.add("pg-terminate", f"{killed} connections")

    return inject


def pause_sweeper(pause_s: float) -> Injector:
    """SIGSTOP the process holding the sweep lease right now for ``pause_s``, then SIGCONT."""

    def inject(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
        pid = current_sweeper(cluster)
        if pid is None or not cluster.is_pool_child(pid):
            return
        os.kill(pid, signal.SIGSTOP)
        log.add("pause-sweeper", f"pid {pid} for {pause_s}s")
        try:
            time.sleep(pause_s)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    return inject


def kill_sweeper(cluster: Cluster, rng: random.Random, log: FaultLog) -> None:
    """SIGKILL a pool child holding a bucket's sweep lease right now (mid-sweep): the newest
    grant of that bucket, not released. Its lease outlives it; the next sweep of the bucket
    takes it over at once (docs/design.md §5)."""
    holders = sweep_holders(cluster)
    rng.shuffle(holders)
    for lease, fence, pid in holders:
        if cluster.kill_child(pid):
            log.add("kill-sweeper", f"pid {pid} holding {lease} fence {fence}")
            return


def sweep_holders(cluster: Cluster) -> list[tuple[str, int, int]]:
    """(lease@bucket, fence, pid) of each bucket's newest sweep grant not yet released."""
    newest: dict[str, tuple[int, int]] = {}
    released: set[tuple[str, int]] = set()
    for entry in read_lines(cluster.config.fences):
        if entry["ev"] == "grant" and entry["fence"] > newest.get(entry["lease"], (0, 0))[0]:
            newest[entry["lease"]] = (entry["fence"], entry["pid"])
        elif entry["ev"] == "release":
            released.add((entry["lease"], entry["fence"]))
    return sorted((lease, fence, pid) for lease, (fence, pid) in newest.items()
                  if (lease, fence) not in released)


def current_sweeper(cluster: Cluster) -> int | None:
    """The pid of the newest sweep grant not yet released, if any."""
    open_grants: dict[int, int] = {}
    for entry in read_lines(cluster.config.fences):
        if entry["ev"] == "grant":
            open_grants[entry["fence"]] = entry["pid"]
        elif entry["ev"] == "release":
            open_grants.pop(entry["fence"], None)
    if not open_grants:
        return None
    return open_grants[max(open_grants)]
