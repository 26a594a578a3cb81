"""The reliability scenarios, each at a CI size and a full size.

Every scenario builds its own cluster (private redis-server as broker, and as store unless it
tests PostgreSQL), runs a load with faults, and returns a ``Report``; ``problems`` lists what
the scenario expected to happen and did not (e.g. no kill landed), which is a harness failure,
not an invariant violation. The cluster is torn down in ``finally`` whatever happens.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery_sagas.clock import SystemClock
from celery_sagas.errors import SagaError
from celery_sagas.integration.dispatcher import SWEEP_TASK
from celery_sagas.leases import Leases
from celery_sagas.reconcile import SWEEP_LEASE
from tests.e2e.conftest import wait_until
from tests.reliability import faults
from tests.reliability.app import DEFINITION, STEP_NAMES
from tests.reliability.cluster import Cluster, children_of, make_cluster, new_tag
from tests.reliability.harness import FaultLog, Load, Report, finish, run_load, settle_one
from tests.reliability.recording import read_lines

_OPS = ("reserve", "charge", "charge_idem", "ship", "release", "refund")


@dataclass(frozen=True)
class Size:
    """How big a scenario runs."""

    name: str

    def n(self, ci: int, full: int) -> int:
        """``ci`` in CI, ``full`` in the full run."""
        return ci if self.name == "ci" else full


CI = Size("ci")
FULL = Size("full")


def mixed_plan(rng: random.Random, index: int) -> dict[str, Any]:
    """Mostly happy sagas; some idempotent, declined, crashing or flaky."""
    plan: dict[str, Any] = {"sleep": {op: rng.randint(20, 120) for op in _OPS}}
    roll = rng.random()
    if roll < 0.15:
        plan["idempotent"] = True
        if rng.random() < 0.5:
            plan["flaky"] = {"charge_idem": 1}
    elif roll < 0.30:
        plan["decline"] = "ship"
        plan["idempotent"] = rng.random() < 0.5
        plan["release_failures"] = rng.choice((0, 0, 1))
    elif roll < 0.35:
        plan["decline"] = "charge"
    elif roll < 0.38:
        plan["crash"] = "charge"
    elif roll < 0.41:
        plan["crash_after"] = "reserve"
    return plan


def compensation_plan(rng: random.Random, index: int) -> dict[str, Any]:
    """Mostly sagas that compensate, with slow compensators (so kills land in them)."""
    plan: dict[str, Any] = {"sleep": {op: rng.randint(10, 40) for op in _OPS}}
    plan["sleep"]["release"] = rng.randint(150, 400)
    plan["sleep"]["refund"] = rng.randint(150, 400)
    if rng.random() < 0.85:
        plan["decline"] = "ship"
    plan["idempotent"] = rng.random() < 0.5
    return plan


def _standard(cluster: Cluster, workers: int = 2, beats: int = 1,
              envs: list[dict[str, str]] | None = None) -> None:
    started = [cluster.worker(env=(envs or [{}] * workers)[i], wait=False) for i in range(workers)]
    for _ in range(beats):
        cluster.beat()
    for process in started:
        cluster.wait_ready(process)


def _run(workdir: Path, scenario: str, build: Callable[[Path], Cluster],
         body: Callable[[Cluster], Report]) -> Report:
    cluster = build(workdir / scenario)
    try:
        return body(cluster)
    finally:
        cluster.close()


def _expect(report: Report, condition: bool, problem: str) -> None:
    if not condition:
        report.problems.append(problem)


def _stack(broker: str | None, store: str | None) -> tuple[Callable[[Path], Cluster], str]:
    """A cluster builder for a broker/store pair (None: the private redis-server)."""
    if broker is None and store is None:
        return make_cluster, ""
    tag = new_tag()

    def build(path: Path) -> Cluster:
        return make_cluster(path, broker=broker, store=_named(store, tag), tag=tag,
                            private_redis=broker is None or store is None)

    return build, f" ({'RabbitMQ' if broker else 'redis'} broker, "\
                  f"{'PostgreSQL' if store else 'redis'} store)"


def _named(store: str | None, tag: str) -> str | None:
    """A PostgreSQL URL whose connections carry this run's application_name."""
    if store is None or not store.startswith("postgresql"):
        return store
    return f"{store}{'&' if '?' in store else '?'}application_name={tag}"


def pool_kills(workdir: Path, size: Size, broker: str | None = None,
               store: str | None = None) -> Report:
    """SIGKILL random pool children (in bodies and anywhere) while sagas run."""
    build, label = _stack(broker, store)

    def body(cluster: Cluster) -> Report:
        _standard(cluster)
        load = Load(size.n(50, 300), mixed_plan, fault_every=0.6,
                    injectors=[(faults.kill_in_body(), 0.6), (faults.kill_random_child, 0.4)])
        report = run_load(cluster, load, f"pool-child SIGKILL{label}")
        _expect(report, report.faults["kill-child-in-body"] > 0, "no kill landed in a body")
        return report

    return _run(workdir, f"pool-kills{new_tag()}", build, body)


def worker_kills(workdir: Path, size: Size, broker: str | None = None,
                 store: str | None = None) -> Report:
    """SIGKILL whole workers (main process and pool), then start fresh ones."""
    build, label = _stack(broker, store)

    def body(cluster: Cluster) -> Report:
        _standard(cluster)
        load = Load(size.n(40, 150), mixed_plan, fault_every=size.n(3, 5),
                    injectors=[(faults.kill_worker_and_restart, 1.0)], faults_after_load=1.0)
        report = run_load(cluster, load, f"whole-worker SIGKILL + restart{label}")
        _expect(report, report.faults["kill-worker"] > 0, "no worker was killed")
        return report

    return _run(workdir, f"worker-kills{new_tag()}", build, body)


def cancel_storm(workdir: Path, size: Size) -> Report:
    """Operators cancel running sagas (4 threads each) while pool children are killed."""

    def body(cluster: Cluster) -> Report:
        _standard(cluster)
        load = Load(size.n(40, 200), mixed_plan, fault_every=0.3,
                    injectors=[(faults.cancel_running(), 0.8), (faults.kill_in_body(), 0.2)])
        report = run_load(cluster, load, "cancel running sagas (4 racing operators)")
        _expect(report, report.faults["cancel"] > 0, "nothing was cancelled")
        return report

    return _run(workdir, "cancel-storm", make_cluster, body)


def queue_purges(workdir: Path, size: Size) -> Report:
    """Purge the queue over and over: every message may be lost; the store must not be."""

    def body(cluster: Cluster) -> Report:
        _standard(cluster)
        load = Load(size.n(30, 150), mixed_plan, fault_every=0.8,
                    injectors=[(faults.purge_queue, 1.0)])
        report = run_load(cluster, load, "queue purged (messages lost)")
        _expect(report, report.faults["queue-purge"] > 0, "the queue was never purged")
        return report

    return _run(workdir, "queue-purge", make_cluster, body)


def compensation_kills(workdir: Path, size: Size) -> Report:
    """SIGKILL pool children while compensators run."""

    def body(cluster: Cluster) -> Report:
        _standard(cluster)
        load = Load(size.n(30, 150), compensation_plan, fault_every=0.5,
                    injectors=[(faults.kill_in_body(("release", "refund"), "kill-compensator"), 1)])
        report = run_load(cluster, load, "SIGKILL during compensation")
        _expect(report, report.faults["kill-compensator"] > 0, "no kill landed in a compensator")
        return report

    return _run(workdir, "compensation-kills", make_cluster, body)


def redis_restarts(workdir: Path, size: Size) -> Report:
    """SIGKILL the redis-server used as store and broker (AOF, fsync always), restart it."""

    def body(cluster: Cluster) -> Report:
        _standard(cluster)
        load = Load(size.n(40, 200), mixed_plan, fault_every=size.n(3, 5),
                    injectors=[(faults.restart_redis, 1.0)], settle_timeout=120)
        report = run_load(cluster, load, "redis SIGKILL + restart (store and broker)")
        _expect(report, report.faults["redis-sigkill"] > 0, "redis was never killed")
        return report

    return _run(workdir, "redis-restarts", make_cluster, body)


def script_flushes(workdir: Path, size: Size) -> Report:
    """SCRIPT FLUSH the store's redis-server over and over while sagas run."""

    def body(cluster: Cluster) -> Report:
        _standard(cluster)
        load = Load(size.n(30, 150), mixed_plan, fault_every=0.4,
                    injectors=[(faults.script_flush, 1.0)])
        report = run_load(cluster, load, "SCRIPT FLUSH")
        _expect(report, report.faults["script-flush"] > 0, "no SCRIPT FLUSH")
        return report

    return _run(workdir, "script-flush", make_cluster, body)


def two_beats(workdir: Path, size: Size) -> Report:
    """Two beats (every sweep sent twice), slow sweeps, sweepers paused past their lease, and
    lost messages (queue purges) that give the sweeps work."""

    def build(path: Path) -> Cluster:
        return make_cluster(path, scan_delay_ms=100, sweep_page_size=5, sweep_lease=1.5,
                            sweep_interval=0.5)

    def body(cluster: Cluster) -> Report:
        _standard(cluster, beats=2)
        # Purges lose messages, so sweeps have sagas to re-drive: a sweeper paused past its
        # lease then has writes to attempt under its old fence.
        load = Load(size.n(30, 150), mixed_plan, fault_every=1.0, faults_after_load=2.0,
                    injectors=[(faults.pause_sweeper(2.5), 0.5), (faults.purge_queue, 0.3),
                               (faults.kill_random_child, 0.2)])
        report = run_load(cluster, load, "two celery beats")
        _expect(report, report.fences.get("grants", 0) > 0, "no sweep ran")
        return report

    return _run(workdir, "two-beats", build, body)


def paused_sweeper(workdir: Path, size: Size) -> Report:
    """A sweeper SIGSTOPped past its lease while a newer grant exists: its writes are refused.

    Stale sagas (their messages purged) give the sweep work; a worker with one process starts
    a slow sweep (one saga per page, a pause before each scan); after its first re-drive it is
    stopped, its lease expires, this process takes a newer grant, and the sweeper is continued:
    its next write carries the old fence. Then the sagas are settled normally and every
    invariant is checked.
    """

    def build(path: Path) -> Cluster:
        return make_cluster(path, scan_delay_ms=400, sweep_page_size=1, sweep_lease=1.5)

    def body(cluster: Cluster) -> Report:
        report = Report("sweeper paused past its lease (fenced out)")
        started = [f"{cluster.config.prefix}-stale-{i}" for i in range(size.n(6, 20))]
        for saga_id in started:
            cluster.sagas.start(DEFINITION, {"sku": "s", "amount": 1, "id": saga_id, "plan": {}},
                                saga_id=saga_id)
        faults.purge_queue(cluster, random.Random(0), FaultLog())
        time.sleep(cluster.config.stale_after + 0.2)  # the sagas must be stale to be re-driven
        worker = cluster.worker(concurrency=1)
        cluster.shop.app.send_task(SWEEP_TASK, queue=cluster.config.queue)
        children = set(children_of(worker.pid))
        # Stop it after its first re-drive: it is then waiting before its next page's scan.
        pid = wait_until(lambda: _writer_among(cluster, children), timeout=30,
                         what="a fenced write by the sweeping worker")
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(cluster.config.sweep_lease + 0.5)
            newer = Leases(cluster.shop.store, SystemClock(), owner="probe").acquire(
                SWEEP_LEASE, 60_000)
            _expect(report, newer is not None, "the paused sweeper's lease did not expire")
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: "sweep stopped fence=" in worker.text(), timeout=30,
                   what="the paused sweeper to stop")
        if newer is not None:
            Leases(cluster.shop.store, SystemClock(), owner="probe").release(newer)
        for saga_id in started:
            settle_one(cluster, saga_id)
        finish(cluster, started, report)
        refused = [e for e in read_lines(cluster.config.fences)
                   if e["ev"] == "write" and e["pid"] == pid and e["outcome"] == "refused"]
        report.faults["sweeper-paused-past-lease"] += 1
        _expect(report, bool(refused), "the resumed sweeper made no refused write")
        return report

    return _run(workdir, "paused-sweeper", build, body)


def _writer_among(cluster: Cluster, pids: set[int]) -> int | None:
    writers = [e["pid"] for e in read_lines(cluster.config.fences) if e["ev"] == "write"]
    return next((pid for pid in writers if pid in pids), None)


def pg_terminations(workdir: Path, size: Size, postgres_url: str, broker: str | None = None,
                    label: str = "redis broker") -> Report:
    """``pg_terminate_backend`` the PostgreSQL store's connections over and over."""
    tag = new_tag()
    store = _named(postgres_url, tag)

    def build(path: Path) -> Cluster:
        return make_cluster(path, store=store, broker=broker, tag=tag)

    def body(cluster: Cluster) -> Report:
        _standard(cluster)
        load = Load(size.n(30, 150), mixed_plan, fault_every=0.7,
                    injectors=[(faults.terminate_backends(tag), 1.0)])
        report = run_load(cluster, load, f"pg_terminate_backend ({label} + PostgreSQL store)")
        _expect(report, report.faults["pg-terminate"] > 0, "no connection terminated")
        return report

    return _run(workdir, f"pg-terminate-{tag}", build, body)


def clock_skew(workdir: Path, size: Size) -> Report:
    """Workers whose clocks disagree (see docs/reliability.md for what happens)."""
    skews = [0, 4_000] if size.name == "ci" else [0, 4_000, -4_000, 15_000]

    def build(path: Path) -> Cluster:
        # Slow sweeps (paged, a pause per page) so sweeps of differently-clocked workers overlap.
        return make_cluster(path, scan_delay_ms=50, sweep_page_size=10)

    def body(cluster: Cluster) -> Report:
        envs = [{"REL_CLOCK_SKEW_MS": str(skew)} for skew in skews]
        _standard(cluster, workers=len(skews), envs=envs)
        load = Load(size.n(30, 150), mixed_plan, fault_every=1.0,
                    injectors=[(faults.kill_in_body(), 1.0)])
        report = run_load(cluster, load, f"clock skew {skews} ms")
        late = sum(p.text().count("code time_limit") for p, _ in cluster.workers)
        report.notes.append(f"steps judged vanished by their time limit: {late}")
        return report

    return _run(workdir, "clock-skew", build, body)


def slow_plan(rng: random.Random, index: int) -> dict[str, Any]:
    """Bodies that outlast a 1 s visibility timeout (so the broker delivers them again)."""
    plan = mixed_plan(rng, index)
    plan["sleep"].update({op: rng.randint(1200, 2200) for op in ("reserve", "charge", "charge_idem")})
    return plan


def visibility_redelivery(workdir: Path, size: Size) -> Report:
    """A 1 s Redis visibility timeout: messages of running bodies are delivered a second time."""

    def build(path: Path) -> Cluster:
        return make_cluster(path, visibility_timeout=1.0)

    def body(cluster: Cluster) -> Report:
        _standard(cluster)
        load = Load(size.n(8, 40), slow_plan, in_flight=8)
        report = run_load(cluster, load, "broker redelivery while running (visibility 1 s)")
        again = sum(p.text().count("attempt still running elsewhere") for p in cluster.processes)
        report.faults["redelivered-while-running"] += again
        _expect(report, again > 0, "no message was delivered twice while its body ran")
        return report

    return _run(workdir, "visibility", build, body)


def hanging_plan(rng: random.Random, index: int) -> dict[str, Any]:
    """One saga in four hangs in charge past the 2 s hard time limit."""
    plan = mixed_plan(rng, index)
    if rng.random() < 0.25:
        plan = {"sleep": {"charge": 4000, "charge_idem": 4000}, "idempotent": rng.random() < 0.3}
    return plan


def time_limits(workdir: Path, size: Size) -> Report:
    """Bodies past the task's hard time limit (Celery kills the child): never guessed."""

    def build(path: Path) -> Cluster:
        return make_cluster(path, time_limit=2.0)

    def body(cluster: Cluster) -> Report:
        _standard(cluster)
        load = Load(size.n(20, 60), hanging_plan, in_flight=8)
        report = run_load(cluster, load, "hard time limit exceeded")
        limited = sum(p.text().count("Hard time limit") for p in cluster.processes)
        report.faults["time-limit-kill"] += limited
        _expect(report, limited > 0, "no body hit the hard time limit")
        return report

    return _run(workdir, "time-limits", build, body)


class _CountingDispatcher:
    """Counts the step and compensator messages this process sends, by step name."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sent: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def send_step(self, saga_id: str, step: Any) -> None:
        with self._lock:
            self.sent.append(("step", step.name))
        self.inner.send_step(saga_id, step)

    def send_compensation(self, saga_id: str, step: Any) -> None:
        with self._lock:
            self.sent.append(("compensation", step.name))
        self.inner.send_compensation(saga_id, step)

    def send_advance(self, saga_id: str) -> None:
        self.inner.send_advance(saga_id)


def _race(threads: int, action: Callable[[], Any]) -> list[Any]:
    barrier = threading.Barrier(threads)
    results: list[Any] = [None] * threads

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = action()
        except Exception as exc:
            results[index] = exc

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    return results


def resume_race(workdir: Path, size: Size, threads: int = 16) -> Report:
    """16 threads resume one manual-review saga at once: one resume, one dispatch, one body."""

    def body(cluster: Cluster) -> Report:
        cluster.worker()
        report = Report(f"{threads} threads resume one saga")
        sagas = cluster.sagas
        counting = _CountingDispatcher(sagas.engine.dispatcher)
        sagas.engine.dispatcher = counting
        started = [_forward_race(cluster, report, counting, threads),
                   _compensation_race(cluster, report, counting, threads)]
        expectations = list(report.problems)
        finish(cluster, started, report)
        report.problems = expectations
        return report

    return _run(workdir, "resume-race", make_cluster, body)


def _forward_race(cluster: Cluster, report: Report, counting: _CountingDispatcher,
                  threads: int) -> str:
    """Charge applied but unknown → review; resolve committed; 16 resumes → ship runs once."""
    sagas = cluster.sagas
    saga_id = f"{cluster.config.prefix}-fwd"
    sagas.start(DEFINITION, {"sku": "s", "amount": 5, "id": "o", "plan": {"crash_after": "charge"}},
                saga_id=saga_id)
    record = sagas.wait(saga_id, timeout=60)
    _expect(report, record.state == "manual-review", f"forward saga is {record.state}")
    charge = record.step(STEP_NAMES["charge"])
    assert charge is not None
    sagas.resolve(saga_id, STEP_NAMES["charge"], charge.effect_id, "committed",
                  result={"effect": charge.effect_id, "charged": 5})
    results = _race(threads, lambda: sagas.resume(saga_id))
    errors = [r for r in results if isinstance(r, Exception)]
    _expect(report, all(isinstance(e, SagaError) for e in errors),
            f"resume raised undocumented errors: {errors!r}")
    final = settle_one(cluster, saga_id)
    _expect(report, final.state == "completed", f"forward saga ended {final.state}")
    ships = [line for line in _ledger(cluster) if line["op"] == "ship.start"
             and line["saga_id"] == saga_id]
    _expect(report, len(ships) == 1, f"ship body ran {len(ships)}x")
    sent = counting.sent.count(("step", STEP_NAMES["ship"]))
    _expect(report, sent == 1, f"ship dispatched {sent}x by the resuming threads")
    report.notes.append(f"forward: {len(errors)} of {threads} resumes raised; ship sent {sent}x")
    return saga_id


def _compensation_race(cluster: Cluster, report: Report, counting: _CountingDispatcher,
                       threads: int) -> str:
    """Compensation exhausted → review; fix the provider; 16 resumes → one resume, one undo."""
    sagas = cluster.sagas
    saga_id = f"{cluster.config.prefix}-comp"
    down = cluster.config.control / "inventory-down"
    down.touch()
    plan = {"decline": "ship", "inventory": "inventory-down"}
    sagas.start(DEFINITION, {"sku": "s", "amount": 6, "id": "o", "plan": plan}, saga_id=saga_id)
    record = settle_one(cluster, saga_id)
    _expect(report, record.error_code == "compensation_exhausted",
            f"compensation saga is {record.state}/{record.error_code}")
    down.unlink()
    wins: list[int] = []
    lock = threading.Lock()

    def on_write(envelope: Any, expected: int, ok: bool) -> None:
        if ok and envelope.id == saga_id and expected == record.version:
            with lock:
                wins.append(expected)

    cluster.shop.store.listeners.append(on_write)
    before = counting.sent.count(("compensation", STEP_NAMES["reserve"]))
    results = _race(threads, lambda: sagas.resume(saga_id))
    errors = [r for r in results if isinstance(r, Exception)]
    _expect(report, all(isinstance(e, SagaError) for e in errors),
            f"resume raised undocumented errors: {errors!r}")
    final = settle_one(cluster, saga_id)
    _expect(report, final.state == "compensated", f"compensation saga ended {final.state}")
    _expect(report, len(wins) == 1, f"{len(wins)} resumes lifted the review")
    sent = counting.sent.count(("compensation", STEP_NAMES["reserve"])) - before
    _expect(report, sent == 1, f"release dispatched {sent}x by the resuming threads")
    done = [line for line in _ledger(cluster) if line["op"] == "release.done"
            and line["saga_id"] == saga_id]
    _expect(report, len(done) == 1, f"release applied {len(done)}x")
    report.notes.append(f"compensation: {len(wins)} effective resume of {threads}; "
                        f"release sent {sent}x, applied {len(done)}x")
    return saga_id


def _ledger(cluster: Cluster) -> list[dict[str, Any]]:
    return read_lines(cluster.config.ledger)


SCENARIOS: dict[str, Callable[..., Report]] = {
    "pool-kills": pool_kills,
    "worker-kills": worker_kills,
    "compensation-kills": compensation_kills,
    "redis-restarts": redis_restarts,
    "script-flush": script_flushes,
    "two-beats": two_beats,
    "paused-sweeper": paused_sweeper,
    "resume-race": resume_race,
    "clock-skew": clock_skew,
    "queue-purge": queue_purges,
    "cancel-storm": cancel_storm,
    "visibility": visibility_redelivery,
    "time-limits": time_limits,
}

