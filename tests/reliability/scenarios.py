"""The load scenarios: sagas run on real workers while one kind of fault is injected.

Every scenario builds its own cluster (a private redis-server as broker, and as store unless
it tests PostgreSQL), runs a load with faults (``harness.run_load``) and returns a ``Report``;
``problems`` lists what the scenario expected to happen and did not (no kill landed, say),
which is a harness failure, not an invariant violation. The cluster is torn down in
``finally`` whatever happens. Each scenario has a CI size and a full size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tests.isolation import CLUSTER_NODES
from tests.redis_cluster import RedisCluster as RedisClusterNodes
from tests.reliability import faults, probes
from tests.reliability.cluster import (
    Cluster,
    PrivatePostgres,
    PrivateRedis,
    free_ports,
    make_cluster,
    new_tag,
)
from tests.reliability.harness import Injector, Load, PlanFactory, Report, run_load
from tests.reliability.plans import (
    compensation_plan,
    hanging_plan,
    inline_plan,
    mixed_plan,
    options_plan,
    slow_plan,
    waiting_plan,
)

STORE_SOCKET_TIMEOUT_S = 1  # the store clients' socket timeout in the store-stall scenario


@dataclass(frozen=True)
class Size:
    """How big a scenario runs."""

    name: str

    def n(self, ci: int, full: int) -> int:
        """``ci`` in CI, ``full`` in the full run."""
        return ci if self.name == "ci" else full


CI = Size("ci")
FULL = Size("full")


@dataclass
class Chaos:
    """One load scenario: its cluster, its processes, its faults, and the fault it must land."""

    name: str
    title: str
    load: Load
    landed: str
    build: Callable[[Path], Cluster] = make_cluster
    beats: int = 1
    envs: list[dict[str, str]] = field(default_factory=lambda: [{}, {}])
    count_in_logs: str | None = None  # a fault the workers log themselves (count its lines)
    observe: Callable[[Cluster, Report], None] | None = None  # more figures, before teardown

    def run(self, workdir: Path) -> Report:
        """Build the cluster, run the load, check the fault landed, tear everything down."""
        cluster = self.build(workdir / f"{self.name}-{new_tag()}")
        try:
            started = [cluster.worker(env=env, wait=False) for env in self.envs]
            for _ in range(self.beats):
                cluster.beat()
            for process in started:
                cluster.wait_ready(process)
            report = run_load(cluster, self.load, self.title)
            if self.count_in_logs is not None:
                report.faults[self.landed] += sum(
                    p.text().count(self.count_in_logs) for p in cluster.processes)
            if self.observe is not None:
                self.observe(cluster, report)
            if not report.faults[self.landed]:
                report.problems.append(f"no {self.landed} fault landed")
            return report
        finally:
            cluster.close()


def _load(count: int, plans: PlanFactory, every: float, *injectors: tuple[Injector, float],
          settle_timeout: float = 90.0, faults_after_load: float = 0.0) -> Load:
    return Load(count, plans, list(injectors), fault_every=every, settle_timeout=settle_timeout,
                faults_after_load=faults_after_load)


def _stack(broker: str | None, store: str | None) -> tuple[Callable[[Path], Cluster], str]:
    """A cluster builder for a broker/store pair (None: the private redis-server)."""
    if broker is None and store is None:
        return make_cluster, ""
    tag = new_tag()

    def build(path: Path) -> Cluster:
        return make_cluster(path, broker=broker, store=named(store, tag), tag=tag,
                            private_redis=broker is None or store is None)

    return build, (f" ({'RabbitMQ' if broker else 'redis'} broker, "
                   f"{'PostgreSQL' if store else 'redis'} store)")


class Server(Protocol):
    """A server private to one run (a redis-server, a PostgreSQL or Redis Cluster)."""

    def start(self) -> object:
        """Start it and wait until it answers."""

    def close(self) -> None:
        """Stop it and delete its files."""


def _on(server: Server, make: Callable[[Path], Cluster]) -> Callable[[Path], Cluster]:
    """A cluster builder that starts ``server`` first, and closes it if the cluster fails."""

    def build(path: Path) -> Cluster:
        server.start()
        try:
            return make(path)
        except BaseException:
            server.close()
            raise

    return build


def named(store: str | None, tag: str) -> str | None:
    """A PostgreSQL URL whose connections carry the run's tag as their application_name."""
    if store is None or not store.startswith("postgresql"):
        return store
    return f"{store}{'&' if '?' in store else '?'}application_name={tag}"


def pool_kills(workdir: Path, size: Size, broker: str | None = None,
               store: str | None = None) -> Report:
    """SIGKILL random pool children (in bodies and anywhere) while sagas run."""
    build, label = _stack(broker, store)
    load = _load(size.n(50, 300), mixed_plan, 0.6, (faults.kill_in_body(), 0.6),
                 (faults.kill_random_child, 0.4))
    return Chaos("pool-kills", f"pool-child SIGKILL{label}", load, "kill-child-in-body",
                 build).run(workdir)


def option_kills(workdir: Path, size: Size) -> Report:
    """Sagas using issue 29's options (retry_on, a caught StepFailed, compensate_unknown,
    parallel compensation) while pool children are SIGKILLed in step bodies, in compensators
    and anywhere."""
    load = _load(size.n(50, 300), options_plan, 0.6, (faults.kill_in_body(), 0.5),
                 (faults.kill_in_body(("release", "refund"), "kill-compensator"), 0.2),
                 (faults.kill_random_child, 0.3))
    return Chaos("option-kills", "retry_on, StepFailed, compensate_unknown, parallel undo",
                 load, "kill-child-in-body").run(workdir)


def inline_kills(workdir: Path, size: Size) -> Report:
    """Sagas whose steps run inline while pool children are SIGKILLed in bodies (inline ones
    included) and anywhere (during the write that settles one step and claims the next too)."""
    build, label = _stack(None, None)
    load = _load(size.n(50, 300), inline_plan, 0.6, (faults.kill_in_body(), 0.6),
                 (faults.kill_random_child, 0.4))
    return Chaos("inline-kills", f"inline steps, pool-child SIGKILL{label}", load,
                 "kill-child-in-body", build).run(workdir)


def worker_kills(workdir: Path, size: Size, broker: str | None = None,
                 store: str | None = None) -> Report:
    """SIGKILL whole workers (main process and pool), then start fresh ones."""
    build, label = _stack(broker, store)
    load = _load(size.n(40, 150), mixed_plan, size.n(3, 5), (faults.kill_worker_and_restart, 1),
                 faults_after_load=1.0)
    return Chaos("worker-kills", f"whole-worker SIGKILL + restart{label}", load, "kill-worker",
                 build).run(workdir)


def compensation_kills(workdir: Path, size: Size) -> Report:
    """SIGKILL pool children while compensators run."""
    killer = faults.kill_in_body(("release", "refund"), "kill-compensator")
    load = _load(size.n(30, 150), compensation_plan, 0.5, (killer, 1))
    return Chaos("compensation-kills", "SIGKILL during compensation", load,
                 "kill-compensator").run(workdir)


def redis_restarts(workdir: Path, size: Size, appendfsync: str = "everysec") -> Report:
    """SIGKILL the redis-server used as store and broker (AOF fsynced every second, or with
    ``appendfsync="always"`` before each reply), restart it."""

    def build(path: Path) -> Cluster:
        return make_cluster(path, appendfsync=appendfsync)

    load = _load(size.n(40, 200), mixed_plan, size.n(3, 5), (faults.restart_redis, 1),
                 settle_timeout=120, faults_after_load=3.5)  # a quiet machine ends the load early
    always = appendfsync == "always"
    return Chaos("redis-restarts-always" if always else "redis-restarts",
                 f"redis SIGKILL + restart (store and broker, appendfsync {appendfsync})", load,
                 "redis-sigkill", build).run(workdir)


def broker_restarts(workdir: Path, size: Size) -> Report:
    """SIGKILL the broker, a redis-server of its own that keeps nothing (no AOF, no snapshot),
    while sagas are queued, and start it again empty: every queued message is lost. The store
    (the run's redis-server, AOF) keeps the sagas; the sweep sends their steps again. No saga
    may be lost or go to review for it."""
    broker = PrivateRedis(workdir / f"broker-redis-{new_tag()}", appendfsync=None)

    build = _on(broker, lambda path: make_cluster(path, broker=f"{broker.url}/0"))

    def observe(cluster: Cluster, report: Report) -> None:
        lost = sum(int(f.detail.split()[0]) for f in report.fault_log
                   if f.kind == "broker-restart")
        report.notes.append(f"queued messages lost with the broker: {lost}")
        if not lost:
            report.problems.append("no broker restart found messages queued")

    # The first restart 1-3 s in, while the first sagas' steps still wait in the queue (a quiet
    # machine runs the CI-sized load in about 3 s), and restarts go on 3 s past the load.
    load = _load(size.n(30, 200), mixed_plan, size.n(2, 4), (faults.restart_broker(broker), 1),
                 settle_timeout=120, faults_after_load=3.0)
    try:
        return Chaos("broker-restart", "broker (redis, no persistence) SIGKILL + restart empty",
                     load, "broker-restart", build, observe=observe).run(workdir)
    finally:
        broker.close()


def store_stalls(workdir: Path, size: Size) -> Report:
    """SIGSTOP the store's own redis-server (the broker is another) for 1.5-4 s, past the
    clients' 1 s socket timeout, while sagas run: replies of claims and outcomes are lost and
    the writes land when it resumes. No saga may go to review for it (docs/guarantees.md)."""
    server = PrivateRedis(workdir / f"store-redis-{new_tag()}")

    build = _on(server, lambda path: make_cluster(
        path, store=f"{server.url}/1?socket_timeout={STORE_SOCKET_TIMEOUT_S}"))

    # The first stall 2 s in, and stalls go on for 3 s past the load: on a quiet machine the
    # CI-sized load is over in about 3 s, and a stall must land while sagas are in flight.
    load = _load(size.n(30, 150), mixed_plan, size.n(2, 6),
                 (faults.stall_store(server, (1.5, 4.0)), 1), settle_timeout=120,
                 faults_after_load=3.0)
    try:
        return Chaos("store-stall", f"store SIGSTOP past the {STORE_SOCKET_TIMEOUT_S} s socket timeout",
                     load, "store-sigstop", build).run(workdir)
    finally:
        server.close()


UNDECRYPTABLE_LOG = "undecryptable: no configured encryption key opens"  # _delivery's refusal


def key_rotation(workdir: Path, size: Size) -> Report:
    """A key rotation that missed a worker (docs/operations.md, "Rotating encryption keys"):
    sagas are sealed with a new key (``[new, old]``), and a second worker runs with the old key
    alone; it receives steps it cannot decrypt, takes back any claim and reports the record
    ``undecryptable`` (never an ambiguity), and the sweep sends the step again. Then it is
    restarted with the key, and the episode repeats on a keyed worker. Every saga settles,
    with no review for it."""
    from cryptography.fernet import Fernet

    old, new = (Fernet.generate_key().decode() for _ in range(2))
    keyed, keyless = {"REL_ENCRYPTION_KEYS": f"{new},{old}"}, {"REL_ENCRYPTION_KEYS": old}

    def build(path: Path) -> Cluster:
        return make_cluster(path, encryption_keys=(new, old))

    def observe(cluster: Cluster, report: Report) -> None:
        report.faults["undecryptable-refusal"] = sum(
            p.text().count(UNDECRYPTABLE_LOG) for p, _ in cluster.workers)

    load = _load(size.n(30, 200), mixed_plan, size.n(3, 5),
                 (faults.lagging_key_rollout(keyed, keyless, (2.0, 4.0)), 1),
                 settle_timeout=120, faults_after_load=2.0)
    return Chaos("key-rotation", "a worker without the new encryption key, then given it", load,
                 "undecryptable-refusal", build, envs=[keyed, keyless],
                 observe=observe).run(workdir)


def script_flushes(workdir: Path, size: Size) -> Report:
    """SCRIPT FLUSH the store's redis-server over and over while sagas run."""
    load = _load(size.n(30, 150), mixed_plan, 0.4, (faults.script_flush, 1))
    return Chaos("script-flush", "SCRIPT FLUSH", load, "script-flush").run(workdir)


def queue_purges(workdir: Path, size: Size) -> Report:
    """Purge the queue over and over: every message may be lost; the store must not be."""
    load = _load(size.n(30, 150), mixed_plan, 0.8, (faults.purge_queue, 1))
    return Chaos("queue-purge", "queue purged (messages lost)", load, "queue-purge").run(workdir)


def cancel_storm(workdir: Path, size: Size) -> Report:
    """Operators cancel running sagas (4 threads each) while pool children are killed."""
    load = _load(size.n(40, 200), mixed_plan, 0.3, (faults.cancel_running(), 0.8),
                 (faults.kill_in_body(), 0.2))
    return Chaos("cancel-storm", "cancel running sagas (4 racing operators)", load,
                 "cancel").run(workdir)


def two_beats(workdir: Path, size: Size) -> Report:
    """Two beats (every sweep sent twice), slow sweeps, sweepers paused past their lease, and
    lost messages (queue purges) that give the sweeps work to attempt under an old fence."""
    load = _load(size.n(30, 150), mixed_plan, 1.0, (faults.pause_sweeper(2.5), 0.5),
                 (faults.purge_queue, 0.3), (faults.kill_random_child, 0.2), faults_after_load=2.0)

    def build(path: Path) -> Cluster:
        return make_cluster(path, scan_delay_ms=100, sweep_page_size=5, sweep_lease=1.5,
                            sweep_interval=0.5)

    return Chaos("two-beats", "two celery beats", load, "pause-sweeper", build,
                 beats=2).run(workdir)


def sweeper_kills(workdir: Path, size: Size) -> Report:
    """SIGKILL pool children mid-sweep, each holding a bucket's sweep lease for a minute, while
    messages are lost (queue purges): the next sweep of the bucket takes the dead holder's lease
    over at once (a newer fence) and re-sends what was lost, instead of waiting a minute."""
    load = _load(size.n(30, 150), mixed_plan, 0.8, (faults.kill_sweeper, 0.6),
                 (faults.purge_queue, 0.4), faults_after_load=2.0)

    def build(path: Path) -> Cluster:
        return make_cluster(path, scan_delay_ms=50, sweep_page_size=5, sweep_lease=60.0,
                            sweep_interval=0.5)

    def observe(cluster: Cluster, report: Report) -> None:
        if report.faults["kill-sweeper"] and not report.fences.get("takeovers"):
            report.problems.append("no killed sweeper's lease was taken over")

    return Chaos("sweeper-kill", "sweeping pool children SIGKILLed (60 s sweep lease)", load,
                 "kill-sweeper", build, observe=observe).run(workdir)


def cluster_failovers(workdir: Path, size: Size, *, kill: bool = False,
                      first_port: int | None = None) -> Report:
    """A Redis Cluster store (3 masters, 3 replicas, private to the run) whose masters fail
    over to their replicas while sagas run; the broker is the run's private redis-server, and
    each sweep is split over three shards; the cluster takes six free ports of the run's
    (``CELERY_SAGAS_TEST_PORTS``), or ``first_port`` on."""
    first = first_port if first_port is not None else free_ports(CLUSTER_NODES)
    nodes = RedisClusterNodes(workdir / f"redis-cluster-{new_tag()}", first)

    # Three sweep tasks per interval share the buckets (sagas_sweep_shards).
    build = _on(nodes, lambda path: make_cluster(path, store=nodes.url, sweep_shards=3))

    def observe(cluster: Cluster, report: Report) -> None:
        report.notes.append(f"masters at the end: {nodes.masters()}")

    kind = "master-sigkill" if kill else "cluster-failover"
    load = _load(size.n(60, 300), mixed_plan, 1.0,
                 (faults.cluster_failover(nodes, kill=kill), 1), settle_timeout=120)
    title = "Redis Cluster master SIGKILL, replica promoted" if kill else \
        "Redis Cluster failover (CLUSTER FAILOVER)"
    try:
        return Chaos(f"cluster-{'kill' if kill else 'failover'}", title, load, kind, build,
                     observe=observe).run(workdir)
    finally:
        nodes.stop()  # the node logs stay in the run's directory


def pg_terminations(workdir: Path, size: Size, postgres_url: str, broker: str | None = None,
                    label: str = "redis broker") -> Report:
    """``pg_terminate_backend`` the PostgreSQL store's connections over and over."""
    tag = new_tag()

    def build(path: Path) -> Cluster:
        return make_cluster(path, store=named(postgres_url, tag), broker=broker, tag=tag)

    load = _load(size.n(30, 150), mixed_plan, 0.7, (faults.terminate_backends(tag), 1))
    return Chaos("pg-terminate", f"pg_terminate_backend ({label} + PostgreSQL store)", load,
                 "pg-terminate", build).run(workdir)


def pg_crashes(workdir: Path, size: Size) -> Report:
    """A PostgreSQL store of the run's own (initdb, a free port) stopped with ``pg_ctl stop -m
    immediate`` and started again while sagas run: commits in flight lose their replies or
    are lost. Needs the PostgreSQL server tools (a note says when they are missing)."""
    if not PrivatePostgres.available():
        return Report("pg-crash", notes=["skipped: initdb/pg_ctl are not on the PATH"])
    server = PrivatePostgres()
    tag = new_tag()

    build = _on(server, lambda path: make_cluster(path, store=named(server.url, tag), tag=tag))

    load = _load(size.n(30, 150), mixed_plan, size.n(3, 6), (faults.crash_postgres(server), 1),
                 settle_timeout=120, faults_after_load=3.5)  # a quiet machine ends the load early
    try:
        return Chaos("pg-crash", "PostgreSQL stop -m immediate + restart (private cluster)", load,
                     "pg-immediate-stop", build).run(workdir)
    finally:
        server.close()


def clock_skew(workdir: Path, size: Size) -> Report:
    """Workers whose clocks disagree (docs/reliability.md says what happens)."""
    skews = [0, 4_000] if size.name == "ci" else [0, 4_000, -4_000, 15_000]

    def build(path: Path) -> Cluster:
        # Slow paged sweeps, so sweeps of differently-clocked workers overlap.
        return make_cluster(path, scan_delay_ms=50, sweep_page_size=10)

    def observe(cluster: Cluster, report: Report) -> None:
        late = sum(p.text().count("code time_limit") for p, _ in cluster.workers)
        report.notes.append(f"steps judged vanished by their time limit: {late}")

    load = _load(size.n(30, 150), mixed_plan, 1.0, (faults.kill_in_body(), 1))
    return Chaos("clock-skew", f"clock skew {skews} ms", load, "kill-child-in-body", build,
                 envs=[{"REL_CLOCK_SKEW_MS": str(skew)} for skew in skews],
                 observe=observe).run(workdir)


def visibility_redelivery(workdir: Path, size: Size) -> Report:
    """A 1 s Redis visibility timeout: messages of running bodies are delivered a second time."""

    def build(path: Path) -> Cluster:
        return make_cluster(path, visibility_timeout=1.0)

    load = Load(size.n(8, 40), slow_plan, in_flight=8)
    return Chaos("visibility", "broker redelivery while running (visibility 1 s)", load,
                 "redelivered-while-running", build,
                 count_in_logs="attempt still running elsewhere").run(workdir)


def time_limits(workdir: Path, size: Size) -> Report:
    """Bodies past the task's hard time limit (Celery kills the child): never guessed."""

    def build(path: Path) -> Cluster:
        return make_cluster(path, time_limit=2.0)

    load = Load(size.n(20, 60), hanging_plan, in_flight=8)
    return Chaos("time-limits", "hard time limit exceeded", load, "time-limit-kill", build,
                 count_in_logs="Hard time limit").run(workdir)


def waiting_kills(workdir: Path, size: Size) -> Report:
    """Sleeping, signalled and parent/child sagas while pool children are SIGKILLed and
    whole workers are killed and restarted (docs/design.md §3.4-3.7)."""
    load = _load(size.n(40, 200), waiting_plan, 0.8, (faults.kill_in_body(), 0.5),
                 (faults.kill_worker_and_restart, 0.2), (faults.kill_random_child, 0.3),
                 settle_timeout=120)
    return Chaos("waiting-kills", "timers, signals and child sagas under SIGKILL", load,
                 "kill-child-in-body").run(workdir)


def waiting_cancels(workdir: Path, size: Size) -> Report:
    """Operators cancel sagas while they sleep, wait for a signal or wait for a child, and
    running bodies (children's too), while pool children are killed."""
    load = _load(size.n(40, 200), waiting_plan, 0.3, (faults.cancel_waiting, 0.5),
                 (faults.cancel_running(2), 0.3), (faults.kill_in_body(), 0.2))
    return Chaos("waiting-cancels", "cancel sleeping, waiting and parent sagas", load,
                 "cancel-waiting").run(workdir)


SCENARIOS: dict[str, Callable[[Path, Size], Report]] = {
    "pool-kills": pool_kills,
    "inline-kills": inline_kills,
    "option-kills": option_kills,
    "worker-kills": worker_kills,
    "compensation-kills": compensation_kills,
    "redis-restarts": redis_restarts,
    "redis-restarts-always": lambda workdir, size: redis_restarts(workdir, size, "always"),
    "script-flush": script_flushes,
    "key-rotation": key_rotation,
    "store-stall": store_stalls,
    "broker-restart": broker_restarts,
    "pg-crash": pg_crashes,
    "two-beats": two_beats,
    "sweeper-kill": sweeper_kills,
    "paused-sweeper": lambda workdir, size: probes.paused_sweeper(workdir, size.n(6, 20)),
    "resume-race": lambda workdir, size: probes.resume_race(workdir),
    "clock-skew": clock_skew,
    "queue-purge": queue_purges,
    "cancel-storm": cancel_storm,
    "visibility": visibility_redelivery,
    "time-limits": time_limits,
    "cluster-failover": cluster_failovers,
    "cluster-kill": lambda workdir, size: cluster_failovers(workdir, size, kill=True),
    "waiting-kills": waiting_kills,
    "waiting-cancels": waiting_cancels,
}
