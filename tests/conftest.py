"""Shared fixtures: real-service URLs that skip on a laptop and fail in CI.

Set ``CELERY_SAGAS_REQUIRE_SERVICES=1`` (``.ci/run`` does) to turn a missing service from a
skip into a failure. Every service is probed where its variable points; how tests run side by
side is in tests/isolation.py, and how an interrupted run ends what it started in
tests/processes.py.
"""

from __future__ import annotations

import fcntl
import gc
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import processes
from tests.isolation import WORKER, endpoint, unique
from tests.ordering import slowest_first

# pytest rewrites every test module's asserts on import: with PYTHONDONTWRITEBYTECODE set, each
# xdist worker did it again on every run (12 s of CPU per worker for 280 modules). Cache the
# rewritten modules, and the package's bytecode the spawned workers read, in __pycache__
# (git-ignored) as a run without the variable does.
sys.dont_write_bytecode = False

REQUIRE = os.environ.get("CELERY_SAGAS_REQUIRE_SERVICES") == "1"

REDIS_URL = os.environ.get("CELERY_SAGAS_TEST_REDIS", "redis://127.0.0.1:6379/15")
REDIS_BROKER_URL = os.environ.get("CELERY_SAGAS_TEST_BROKER", "redis://127.0.0.1:6379/14")
POSTGRES_URL = os.environ.get(
    "CELERY_SAGAS_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("CELERY_SAGAS_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test")
REDIS_CLUSTER_URL = os.environ.get(
    "CELERY_SAGAS_TEST_REDIS_CLUSTER", "redis+cluster://127.0.0.1:7101/"
)
RABBITMQ_URL = os.environ.get("CELERY_SAGAS_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")


# Set by the controller (or the only pytest process) for its xdist workers: whether a Redis
# Cluster answered when the run started, and a directory the whole run shares.
CLUSTER_UP = "CELERY_SAGAS_TEST_CLUSTER_UP"
RUN_DIR = "CELERY_SAGAS_TEST_RUN_DIR"


def pytest_configure(config: pytest.Config) -> None:
    """End what the tests start when the run ends or is interrupted; before any xdist worker
    starts, note whether a Redis Cluster already answers (then every worker shares it)."""
    processes.install()
    # A pytest process holds a few hundred MB of long-lived objects (modules, fixtures, test
    # items) that the default thresholds (700, 10, 10) had the cyclic collector rescan about
    # 2,000 times a run: a tenth of an xdist worker's CPU. Collecting every 10,000 allocations
    # instead finds the same garbage, for a quarter of the cost.
    gc.set_threshold(10_000, 10, 10)
    if not WORKER:
        os.environ[CLUSTER_UP] = "1" if _cluster_answers() else "0"
        os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="celery-sagas-run-")
        processes.at_end(_stop_the_runs_cluster)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker, the slowest tests first (tests/ordering.py): every worker sorts its
    collection the same way, and the controller hands the tests out in that order."""
    if hasattr(config, "workerinput"):
        items[:] = slowest_first(items)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's end: no process a test started survives it."""
    processes.kill_all()
    if not WORKER:
        _stop_the_runs_cluster()


def _stop_the_runs_cluster() -> None:
    """Stop the Redis Cluster a worker started for the whole run, if one did."""
    from tests.redis_cluster import RedisCluster

    run = Path(os.environ.get(RUN_DIR, "") or "/nonexistent")
    if (run / "cluster").exists():
        RedisCluster(run / "cluster", endpoint(REDIS_CLUSTER_URL, 7101)[1]).stop()
    shutil.rmtree(run, ignore_errors=True)


def _cluster_answers() -> bool:
    from tests.redis_cluster import cluster_ok

    host, port = endpoint(REDIS_CLUSTER_URL, 7101)
    return _answers(host, port) and cluster_ok(port)


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def need_service(name: str, url: str, default_port: int) -> None:
    """Skip (laptop) or fail (CI) when the service ``url`` names does not answer."""
    host, port = endpoint(url, default_port)
    if _answers(host, port):
        return
    message = f"{name} does not answer on {host}:{port}"
    if REQUIRE:
        pytest.fail(f"{message} (CELERY_SAGAS_REQUIRE_SERVICES=1)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the real Redis store used by tests (``CELERY_SAGAS_TEST_REDIS``)."""
    need_service("Redis", REDIS_URL, 6379)
    return REDIS_URL


@pytest.fixture(scope="session")
def redis_cluster_url() -> str:
    """URL of a 3-master Redis Cluster (``CELERY_SAGAS_TEST_REDIS_CLUSTER``): the one that
    answered there when the run started, or a private one on those ports that the first xdist
    worker to need it starts for the whole run (tests/redis_cluster.py); the run's controller
    stops it at the end."""
    from tests.redis_cluster import RedisCluster, cluster_ok

    host, port = endpoint(REDIS_CLUSTER_URL, 7101)
    if os.environ.get(CLUSTER_UP) == "1":
        return REDIS_CLUSTER_URL
    if host != "127.0.0.1" or shutil.which("redis-server") is None:
        need_service("Redis Cluster", REDIS_CLUSTER_URL, 7101)
    run = Path(os.environ[RUN_DIR])
    with open(run / "cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker starts it; the others wait, then share it
        if not (_answers(host, port) and cluster_ok(port)):
            cluster = RedisCluster(run / "cluster", port, tracked=False)
            try:
                cluster.start()
            except RuntimeError as exc:
                cluster.stop()
                if REQUIRE:
                    pytest.fail(f"cannot start a Redis Cluster: {exc}", pytrace=False)
                pytest.skip(f"cannot start a Redis Cluster: {exc}")
    return REDIS_CLUSTER_URL


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of the real PostgreSQL used by tests."""
    need_service("PostgreSQL", POSTGRES_URL, 5432)
    return POSTGRES_URL


@pytest.fixture(scope="session")
def mysql_url() -> str:
    """URL of the real MariaDB/MySQL used by tests."""
    need_service("MariaDB", MYSQL_URL, 3306)
    return MYSQL_URL


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """URL of the real RabbitMQ broker used by tests."""
    need_service("RabbitMQ", RABBITMQ_URL, 5672)
    return RABBITMQ_URL


@pytest.fixture
def unique_prefix() -> Iterator[str]:
    """A fresh name prefix so tests never share keys or tables."""
    yield unique("t", 12)
