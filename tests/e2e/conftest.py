"""Real ``celery worker`` and ``celery beat`` processes for end-to-end tests.

Every test gets its own queue, store prefix, ledger file and control directory, so tests
never see each other's messages or records. Workers run prefork with 2 processes, exactly as
in production; nothing here uses eager mode. The commands are forked from this process's fork
server (tests/forkserver.py): ``python -m celery -A app ...`` without importing Celery again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from celery.utils.nodenames import host_format

from tests import forkserver, processes
from tests.conftest import REDIS_BROKER_URL as REDIS_BROKER
from tests.e2e.app import Config, Shop, build
from tests.files import read_json_lines
from tests.isolation import unique

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@dataclass
class Process:
    """A celery worker or beat subprocess in its own process group."""

    proc: forkserver.Forked
    log: Path
    name: str = ""  # a worker's node name (``w1a2b3c4d@host``), for control commands to it

    @property
    def pid(self) -> int:
        """The main process id."""
        return self.proc.pid

    def text(self) -> str:
        """Everything the process logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL the whole process group (main process and pool children)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended since: poll may lag
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # pool children the main process left
        processes.forget(self.proc)

    def terminate(self) -> None:
        """Ask for a warm shutdown (SIGTERM to the group) without waiting for it. A group gone
        already is left alone: a fork server's child can end before its server has reported
        the exit that ``poll`` reads (a second terminate of a beat that stopped at once)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def stop(self) -> None:
        """Ask for a warm shutdown; kill if it does not stop in time."""
        if self.proc.poll() is not None:
            return
        self.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=20)
        self.kill()  # what did not stop in time, and pool children the main process left


@dataclass
class Stack:
    """One test's configuration, its client-side app, and the processes it started."""

    config: Config
    shop: Shop
    tmp: Path
    processes: list[Process] = field(default_factory=list)
    app_module: str = "tests.e2e.app"  # what ``celery -A`` loads in the spawned processes

    @property
    def sagas(self) -> Any:
        """The test process's Sagas (same store and broker as the workers)."""
        return self.shop.sagas

    def _spawn(self, args: list[str], name: str) -> Process:
        log = self.tmp / f"{name}-{len(self.processes)}.log"
        env = {**os.environ, **self.config.environ(), "PYTHONPATH": str(ROOT)}
        process = Process(forkserver.celery(["-A", self.app_module, *args], ROOT, env, log), log)
        self.processes.append(process)
        return process

    def worker(self, concurrency: int = 2) -> Process:
        """Start a prefork worker on this test's queue and wait until it is ready."""
        name = f"w{uuid.uuid4().hex[:8]}@%h"
        process = self._spawn(
            ["worker", "--pool", "prefork", "-c", str(concurrency), "-Q", self.config.queue,
             "-n", name, "-l", "INFO", "--without-gossip", "--without-mingle",
             "--without-heartbeat"],
            "worker",
        )
        process.name = host_format(name)
        wait_until(lambda: "ready." in process.text() or process.proc.poll() is not None,
                   timeout=60, what="worker ready")
        assert process.proc.poll() is None, process.text()[-3000:]
        return process

    def beat(self, level: str = "INFO") -> Process:
        """Start celery beat (it sends the sweep every sweep_interval seconds), logging at
        ``level``."""
        schedule = self.tmp / f"beat-{uuid.uuid4().hex[:6]}"
        process = self._spawn(["beat", "-s", str(schedule), "-l", level], "beat")
        wait_until(lambda: "beat: Starting" in process.text() or process.proc.poll() is not None,
                   timeout=60, what="beat started")
        assert process.proc.poll() is None, process.text()[-3000:]
        return process

    def ledger(self) -> list[dict[str, Any]]:
        """Every line the fake provider recorded."""
        return read_json_lines(self.config.ledger)

    def ops(self, op: str, saga_id: str | None = None) -> list[dict[str, Any]]:
        """Ledger lines of one op (optionally of one saga)."""
        return [e for e in self.ledger() if e["op"] == op and saga_id in (None, e.get("saga_id"))]

    def release(self, name: str) -> None:
        """Unblock steps waiting for ``name``."""
        (self.config.control / name).touch()

    def wait_settled(self, saga_id: str, timeout: float = 60.0) -> Any:
        """The record once completed, compensated or in manual review."""
        try:
            return self.sagas.wait(saga_id, timeout=timeout)
        except TimeoutError:
            logs = "\n".join(p.text()[-4000:] for p in self.processes)
            raise AssertionError(f"saga {saga_id} did not settle; logs:\n{logs}") from None

    def close(self) -> None:
        """Stop every process and remove what this test wrote to the services."""
        for process in self.processes:
            process.kill()
        _cleanup(self)


def wipe_store(store: Any) -> None:
    """Remove what a test wrote to a shared store: its SQL tables or its Redis key prefix."""
    if hasattr(store, "drop_tables"):
        store.drop_tables()
    elif hasattr(store, "layout"):
        client = store._client
        keys = list(client.scan_iter(match=store.layout.pattern(), count=1000))
        if keys:
            client.delete(*keys)


def _cleanup(stack: Stack) -> None:
    store = stack.sagas.store
    wipe_store(store)
    store.close()
    # The queue may not exist on this broker.
    with stack.shop.app.connection_for_write() as connection, contextlib.suppress(Exception):
        connection.default_channel.queue_delete(stack.config.queue)


def _make_stack(tmp_path: Path, broker: str, store: str, **overrides: Any) -> Iterator[Stack]:
    tag = unique("e", 10)
    control = tmp_path / "control"
    control.mkdir()
    config = Config(broker=broker, store=store, prefix=tag, queue=f"q-{tag}",
                    ledger=tmp_path / "ledger.jsonl", control=control, **overrides)
    stack = Stack(config, build(config), tmp_path)
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture
def redis_stack(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    """Redis broker + Redis store."""
    yield from _make_stack(tmp_path, REDIS_BROKER, redis_url)


@pytest.fixture
def cluster_stack(tmp_path: Path, redis_cluster_url: str) -> Iterator[Stack]:
    """Redis broker + Redis Cluster store (a 3-master cluster, tests/redis_cluster.py)."""
    yield from _make_stack(tmp_path, REDIS_BROKER, redis_cluster_url)


@pytest.fixture
def rabbit_pg_stack(tmp_path: Path, rabbitmq_url: str, postgres_url: str) -> Iterator[Stack]:
    """RabbitMQ broker + PostgreSQL store."""
    yield from _make_stack(tmp_path, rabbitmq_url, postgres_url)


STACKS = ["redis", "rabbitmq+postgres"]
CLUSTER_STACK = "redis+cluster"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every ``stack`` test on both production stacks, and the ones marked ``cluster``
    also with a Redis Cluster store (the acceptance scenarios of docs/stores.md)."""
    if "stack" in metafunc.fixturenames:
        marked = metafunc.definition.get_closest_marker("cluster") is not None
        metafunc.parametrize("stack", STACKS + ([CLUSTER_STACK] if marked else []), indirect=True)


@pytest.fixture
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """Both production stacks, Redis/Redis and RabbitMQ/PostgreSQL (and Redis broker with a
    Redis Cluster store for tests marked ``cluster``)."""
    if request.param == "redis":
        yield from _make_stack(tmp_path, REDIS_BROKER, request.getfixturevalue("redis_url"))
    elif request.param == CLUSTER_STACK:
        yield from _make_stack(tmp_path, REDIS_BROKER, request.getfixturevalue("redis_cluster_url"))
    else:
        yield from _make_stack(
            tmp_path, request.getfixturevalue("rabbitmq_url"),
            request.getfixturevalue("postgres_url"),
        )
