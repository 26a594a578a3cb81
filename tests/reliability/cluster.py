"""Real processes for the reliability suite: workers, beats, private redis-servers.

Every process runs in its own process group and is SIGKILLed (group-wide) on ``close``. A
fault injector kills only pids that are, at that moment, pool children of a worker this cluster
started (checked through ``/proc`` right before the signal), so a recycled pid is never hit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from celery.utils.nodenames import host_format

from celery_sagas import Sagas
from tests import forkserver, processes
from tests.e2e.conftest import ROOT, Process, wait_until, wipe_store
from tests.isolation import INDEX, port_slice
from tests.reliability.app import Config, Shop, build


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now: from this xdist worker's slice of
    ``CELERY_SAGAS_TEST_PORTS`` (``7601-7699``) when set, so runs sharing a machine keep to
    their own ports, else any."""
    wanted = port_slice(os.environ.get("CELERY_SAGAS_TEST_PORTS", ""))
    if wanted is not None:
        return free_ports(1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free: int = sock.getsockname()[1]
        return free


def free_ports(count: int, fallback: int = 7111) -> int:
    """The first of ``count`` consecutive free ports: in this xdist worker's slice of
    ``CELERY_SAGAS_TEST_PORTS`` when set, else from ``fallback`` (100 ports per worker)."""
    variable = os.environ.get("CELERY_SAGAS_TEST_PORTS", "")
    ports = port_slice(variable) or range(fallback + 100 * INDEX, fallback + 100 * (INDEX + 1))
    for first in range(ports.start, ports.stop - count + 1):
        if all(_free(port) for port in range(first, first + count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports in {ports} "
                       f"(CELERY_SAGAS_TEST_PORTS={variable!r})")


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class PrivateRedis:
    """A redis-server of this run only, on a free port: an append-only file fsynced every
    second as in production (``appendfsync``: "always", or None for no AOF at all), started
    with ``extra`` arguments too."""

    directory: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    appendfsync: str | None = "everysec"
    extra: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>``; callers append the database number."""
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> PrivateRedis:
        """Start (or restart) the server and wait until it answers."""
        self.directory.mkdir(parents=True, exist_ok=True)
        aof = ["--appendonly", "yes", "--appendfsync", self.appendfsync] if self.appendfsync \
            else ["--appendonly", "no"]
        with open(self.directory / "redis.log", "ab") as log:
            self.proc = processes.spawn(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 *aof, "--dir", str(self.directory), "--daemonize", "no", *self.extra],
                stdout=log, stderr=subprocess.STDOUT,
            )
        wait_until(lambda: _answers(self.port) or self.proc.poll() is not None,  # type: ignore[union-attr]
                   timeout=20, what="redis-server up")
        assert self.proc.poll() is None, (self.directory / "redis.log").read_text()[-2000:]
        return self

    def kill(self) -> None:
        """SIGKILL the server (no shutdown save: only what the AOF fsynced survives)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self.proc is not None:
            processes.forget(self.proc)

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open, requests wait unanswered (and run once it
        resumes), so a client's socket timeout loses the replies of writes it sent."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        """Kill the server and delete its files."""
        self.resume()
        self.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


_PG_TOOLS = ("initdb", "pg_ctl")


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster of this run only: ``initdb`` in a directory of its own under /tmp
    (run as the ``postgres`` user when we are root, so not under a root-only run directory),
    listening on 127.0.0.1 on a free port (fsync on: the server's durable defaults). ``crash``
    is ``pg_ctl stop -m immediate`` (no shutdown checkpoint: the next start runs crash
    recovery)."""

    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sagas-pg-")))
    port: int = field(default_factory=free_port)

    @staticmethod
    def available() -> bool:
        """Whether the PostgreSQL server tools are on the PATH."""
        return all(shutil.which(tool) for tool in _PG_TOOLS)

    @property
    def url(self) -> str:
        """The store URL of its ``postgres`` database."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def _data(self) -> Path:
        return self.directory / "data"

    def start(self) -> PrivatePostgres:
        """Create the cluster the first time, start the server and wait until it accepts."""
        if not (self._data / "PG_VERSION").exists():
            self.directory.mkdir(parents=True, exist_ok=True)
            self.directory.chmod(0o755)
            self._own(self.directory)
            self._run("initdb", "-D", str(self._data), "-U", "postgres", "--auth=trust",
                      "-E", "UTF8", "--no-sync")
        self._run("pg_ctl", "-D", str(self._data), "-l", str(self.directory / "postgres.log"),
                  "-o", f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1",
                  "-w", "-t", "60", "start")
        processes.at_end(self._quit)  # pg_ctl detaches the server: no group of ours holds it
        return self

    def _quit(self) -> None:
        """SIGQUIT the postmaster (an immediate shutdown), if it runs."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self._data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGQUIT)

    def crash(self) -> None:
        """Stop the server the way a crash does (``-m immediate``)."""
        self._run("pg_ctl", "-D", str(self._data), "-m", "immediate", "-w", "stop")

    def close(self) -> None:
        """Stop the server and delete the cluster."""
        if (self._data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                self.crash()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _run(self, *command: str) -> None:
        # PostgreSQL refuses to run as root: as root, run its tools as the postgres user.
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *command], check=True, capture_output=True, timeout=120,
                       cwd=self.directory)

    @staticmethod
    def _own(path: Path) -> None:
        if os.geteuid() == 0:
            shutil.chown(path, "postgres")


def _stat(pid: int | str) -> tuple[str, int] | None:
    """(state, parent pid) of a process, from /proc; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: fields follow the last ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    return (fields[0], int(fields[1])) if len(fields) > 2 else None


def parent_of(pid: int) -> int | None:
    """The parent of a live process (a killed child stays a zombie until reaped: None)."""
    found = _stat(pid)
    return None if found is None or found[0] == "Z" else found[1]


def children_of(pid: int) -> list[int]:
    """Live (not zombie) pids whose parent is ``pid`` (a scan of /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(entry)) is not None and stat[0] != "Z" \
                and stat[1] == pid:
            found.append(int(entry))
    return found


@dataclass
class Cluster:
    """One run's configuration, its in-process app, and every process it started."""

    config: Config
    shop: Shop
    app_module: str = "tests.reliability.app"
    processes: list[Process] = field(default_factory=list)
    workers: list[tuple[Process, dict[str, str]]] = field(default_factory=list)
    beats: list[Process] = field(default_factory=list)
    redis: PrivateRedis | None = None
    retired: set[int] = field(default_factory=set)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def sagas(self) -> Sagas:
        """The test process's Sagas (same store and broker as the workers)."""
        return self.shop.sagas

    def _spawn(self, args: list[str], name: str, env: dict[str, str] | None) -> Process:
        log = self.config.workdir / f"{name}-{len(self.processes)}.log"
        environ = {**os.environ, **self.config.environ(), **(env or {}), "PYTHONPATH": str(ROOT)}
        process = Process(forkserver.celery(["-A", self.app_module, *args], ROOT, environ, log),
                          log)
        self.processes.append(process)
        return process

    def worker(self, concurrency: int = 2, env: dict[str, str] | None = None,
               wait: bool = True) -> Process:
        """Start a prefork worker on this run's queue (and wait until it is ready)."""
        name = f"w{uuid.uuid4().hex[:8]}@%h"
        process = self._spawn(
            ["worker", "--pool", "prefork", "-c", str(concurrency), "-Q", self.config.queue,
             "-n", name, "-l", "INFO", "--without-gossip", "--without-mingle",
             "--without-heartbeat"],
            "worker", env,
        )
        process.name = host_format(name)
        with self._lock:
            self.workers.append((process, dict(env or {})))
        if wait:
            self.wait_ready(process)
        return process

    @staticmethod
    def wait_ready(process: Process) -> None:
        """Block until a worker logged ``ready.``."""
        wait_until(lambda: "ready." in process.text() or process.proc.poll() is not None,
                   timeout=60, what="worker ready")
        assert process.proc.poll() is None, process.text()[-3000:]

    def beat(self, env: dict[str, str] | None = None) -> Process:
        """Start celery beat (it sends the sweep every sweep_interval seconds)."""
        schedule = self.config.workdir / f"beat-{uuid.uuid4().hex[:6]}"
        process = self._spawn(["beat", "-s", str(schedule), "-l", "INFO"], "beat", env)
        wait_until(lambda: "beat: Starting" in process.text() or process.proc.poll() is not None,
                   timeout=60, what="beat started")
        assert process.proc.poll() is None, process.text()[-3000:]
        self.beats.append(process)
        return process

    def live_workers(self) -> list[tuple[Process, dict[str, str]]]:
        """Workers whose main process still runs."""
        with self._lock:
            return [(p, env) for p, env in self.workers if p.proc.poll() is None]

    def retire(self, process: Process) -> None:
        """Mark a worker as deliberately stopped (``revive`` leaves it dead)."""
        with self._lock:
            self.retired.add(process.pid)

    def revive(self) -> list[str]:
        """Restart every worker that exited on its own, as a supervisor would; why each died."""
        with self._lock:
            crashed = [(p, env) for p, env in self.workers
                       if p.proc.poll() is not None and p.pid not in self.retired]
            for process, _ in crashed:
                self.retired.add(process.pid)
        reasons = []
        for process, env in crashed:
            last = [line for line in process.text().splitlines()
                    if "CRITICAL" in line or "Unrecoverable" in line]
            reasons.append(last[-1].split("]", 1)[-1].strip()[:160] if last else "exited")
            self.worker(env=env)
        return reasons

    def pool_children(self) -> dict[int, Process]:
        """Every current pool child pid of a live worker, with its worker."""
        return {child: p for p, _ in self.live_workers() for child in children_of(p.pid)}

    def is_pool_child(self, pid: int) -> bool:
        """True when ``pid`` is, right now, a live pool child of one of our workers."""
        return parent_of(pid) in {p.pid for p, _ in self.live_workers()}

    def kill_child(self, pid: int) -> bool:
        """SIGKILL ``pid`` if it is a live pool child of one of our workers right now."""
        if not self.is_pool_child(pid):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            return True
        return False

    def logs(self, tail: int = 3000) -> str:
        """The end of every process log (for failure messages)."""
        return "\n".join(f"--- {p.log.name}\n{p.text()[-tail:]}" for p in self.processes)

    def close(self) -> None:
        """Kill every process group, the private redis, and drop what the run stored."""
        for process in self.processes:
            with contextlib.suppress(Exception):
                process.kill()
        try:
            _drop_store(self)
        finally:
            self.shop.store.close()
            if self.redis is not None:
                self.redis.close()


def _drop_store(cluster: Cluster) -> None:
    """Remove this run's records from a shared store (a private redis just dies)."""
    config = cluster.config
    if cluster.redis is not None and config.store.startswith(cluster.redis.url):
        return
    wipe_store(cluster.shop.store.inner)
    if not config.broker.startswith("redis"):
        with cluster.shop.app.connection_for_write() as connection, \
                contextlib.suppress(Exception):
            connection.default_channel.queue_delete(config.queue)


def new_tag() -> str:
    """A fresh run tag (store prefix, queue name, PostgreSQL application_name)."""
    return "r" + uuid.uuid4().hex[:10]


def make_cluster(workdir: Path, *, broker: str | None = None, store: str | None = None,
                 private_redis: bool = True, tag: str | None = None,
                 appendfsync: str = "everysec", **overrides: object) -> Cluster:
    """A cluster under ``workdir``: a private redis (broker, and store unless ``store``) whose
    AOF is fsynced ``appendfsync`` ("everysec" or "always")."""
    tag = tag or new_tag()
    workdir.mkdir(parents=True, exist_ok=True)
    redis = PrivateRedis(workdir / "redis", appendfsync=appendfsync).start() \
        if private_redis else None
    try:
        config = Config(
            broker=broker or f"{redis.url}/0",  # type: ignore[union-attr]
            store=store or f"{redis.url}/1",  # type: ignore[union-attr]
            prefix=tag, queue=f"q-{tag}", workdir=workdir, **overrides,  # type: ignore[arg-type]
        )
        config.control.mkdir(exist_ok=True)
        config.applied.mkdir(exist_ok=True)
        # The scan delay slows the workers' sweeps (so faults land mid-sweep); the sweeps this
        # process drives to settle the run need not wait (16 buckets of delayed pages each).
        return Cluster(config, build(replace(config, scan_delay_ms=0)), redis=redis)
    except BaseException:
        if redis is not None:
            redis.close()
        raise

