"""A private Redis Cluster for tests: 3 masters and 3 replicas on local ports.

``python -m tests.redis_cluster start|stop [--dir DIR] [--port FIRST]`` runs it from a shell
(``.ci/run`` does); the ``redis_cluster_url`` fixture (tests/conftest.py) reuses a cluster that
already answers on ``CELERY_SAGAS_TEST_REDIS_CLUSTER`` or starts one for the session.
Each node is a ``redis-server --cluster-enabled yes`` without persistence; the cluster is made
with ``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import processes

NODES = 6
DEFAULT_FIRST_PORT = 7101
NODE_TIMEOUT_S = 2.0  # cluster-node-timeout: how long before a silent master is judged failed


def answers(port: int, host: str = "127.0.0.1") -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _cli(port: int, *args: str, timeout: float = 30) -> str:
    done = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                          text=True, timeout=timeout, check=False)
    return done.stdout + done.stderr


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"redis cluster: timed out waiting for {what}")
        time.sleep(0.1)


def cluster_ok(port: int) -> bool:
    """True when the node on ``port`` reports ``cluster_state:ok`` with every slot assigned."""
    info = _cli(port, "cluster", "info", timeout=5)
    return "cluster_state:ok" in info and "cluster_slots_assigned:16384" in info


@dataclass
class RedisCluster:
    """Six redis-server processes forming one cluster (3 masters, 1 replica each)."""

    directory: Path
    first_port: int = DEFAULT_FIRST_PORT
    tracked: bool = True  # False: outlives the pytest process that started it (run-wide)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def ports(self) -> list[int]:
        """The ports of the six nodes."""
        return list(range(self.first_port, self.first_port + NODES))

    @property
    def url(self) -> str:
        """The store URL of this cluster (every node named, any one suffices)."""
        nodes = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+cluster://{nodes}/"

    def start_node(self, port: int) -> None:
        """Start (or restart) one node with its own nodes.conf."""
        node_dir = self.directory / str(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        log = open(node_dir / "redis.log", "ab")  # noqa: SIM115 - the child owns it
        start = processes.spawn if self.tracked else _untracked
        self.procs[port] = start(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled",
             "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(int(NODE_TIMEOUT_S * 1000)),
             "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
             "--dir", str(node_dir), "--daemonize", "no",
             "--pidfile", str(node_dir / "redis.pid")],
            stdout=log, stderr=subprocess.STDOUT,
        )
        _wait(lambda: answers(port), 20, f"node {port}")

    def start(self) -> RedisCluster:
        """Start the six nodes and create the cluster; wait until every node says ok."""
        busy = [port for port in self.ports if answers(port)]
        if busy:
            raise RuntimeError(f"redis cluster: ports already in use: {busy}")
        for port in self.ports:
            self.start_node(port)
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        out = _cli(self.first_port, "--cluster", "create", *nodes, "--cluster-replicas", "1",
                   "--cluster-yes", timeout=60)
        if "[OK] All 16384 slots covered" not in out:
            self.stop()
            raise RuntimeError(f"redis cluster: create failed:\n{out[-2000:]}")
        _wait(lambda: all(cluster_ok(port) for port in self.ports), 30, "cluster_state:ok")
        # A replica that never synced is not eligible for promotion: wait for every link.
        _wait(lambda: sum("master_link_status:up" in _cli(port, "info", "replication", timeout=5)
                          for port in self.ports) == NODES // 2, 30, "replicas in sync")
        return self

    def masters(self) -> list[int]:
        """Ports of the nodes that are masters right now."""
        return [port for port in self.ports
                if answers(port) and "role:master" in _cli(port, "info", "replication", timeout=5)]

    def replica_of(self, master: int) -> int:
        """The port of a live replica of ``master``."""
        for port in self.ports:
            info = _cli(port, "info", "replication", timeout=5) if answers(port) else ""
            if "role:slave" in info and f"master_port:{master}" in info:
                return port
        raise RuntimeError(f"redis cluster: no replica of {master}")

    def failover(self, replica: int, attempts: int = 4) -> None:
        """``CLUSTER FAILOVER`` on ``replica`` until it has taken over its master's slots (a
        manual failover times out after 5 s when the master's ack is late: ask again)."""
        for attempt in range(1, attempts + 1):
            out = _cli(replica, "cluster", "failover", timeout=10)
            if "OK" not in out:
                raise RuntimeError(f"redis cluster: CLUSTER FAILOVER on {replica}: {out.strip()}")
            try:
                self.wait_master(replica, timeout=7)
                return
            except RuntimeError:
                if attempt == attempts:
                    raise

    def wait_master(self, port: int, timeout: float = 30) -> None:
        """Wait until ``port`` is a master, still one half a second later (a failover Redis
        reverts lasts some milliseconds), and the cluster is ok again."""

        def master() -> bool:
            return "role:master" in _cli(port, "info", "replication", timeout=5)

        def settled() -> bool:
            if not master():
                return False
            time.sleep(0.5)
            return master() and cluster_ok(port)

        _wait(settled, timeout, f"{port} promoted")

    def wait_replica(self, port: int, timeout: float = 30) -> None:
        """Wait until ``port`` is a replica whose link to its master is up."""
        _wait(lambda: "master_link_status:up" in _cli(port, "info", "replication", timeout=5),
              timeout, f"{port} replicating")

    def kill(self, port: int) -> None:
        """SIGKILL one node."""
        proc = self.procs.get(port)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if proc is not None:
            processes.forget(proc)

    def stop(self) -> None:
        """Kill every node this object started, and any left by an earlier ``start``."""
        for port in self.ports:
            self.kill(port)
            pidfile = self.directory / str(port) / "redis.pid"
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text().strip())
                if _is_redis(pid, port):
                    os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        """Stop the nodes and delete their files."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def _untracked(args: list[str], **options: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, start_new_session=True, **options)


def _is_redis(pid: int, port: int) -> bool:
    """True if ``pid`` is a redis-server listening on ``port`` (never signal a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # redis-server rewrites its title to "redis-server 127.0.0.1:<port> [cluster]"
    return bool(cmdline) and cmdline[0].startswith(b"redis-server") \
        and f":{port} ".encode() in cmdline[0] + b" "


def main(argv: list[str] | None = None) -> int:
    """Start or stop a private cluster from a shell."""
    parser = argparse.ArgumentParser(prog="python -m tests.redis_cluster")
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "sagas-cluster"))
    parser.add_argument("--port", type=int, default=DEFAULT_FIRST_PORT)
    args = parser.parse_args(argv)
    cluster = RedisCluster(Path(args.dir), args.port)
    if args.action == "stop":
        cluster.close()
        return 0
    if all(answers(port) for port in cluster.ports) and cluster_ok(cluster.first_port):
        print(f"redis cluster already up: {cluster.url}")
        return 0
    cluster.start()
    print(f"redis cluster up: {cluster.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
