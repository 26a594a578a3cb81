"""Shared fixtures: real-service URLs that skip on a laptop and fail in CI.

Set ``CELERY_SAGAS_REQUIRE_SERVICES=1`` (``.ci/run`` does) to turn a missing service from a
skip into a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Iterator

import pytest

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


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def need_service(name: str, host: str, port: int) -> None:
    """Skip (laptop) or fail (CI) when a service does not answer."""
    if _answers(host, port):
        return
    message = f"{name} does not answer on {host}:{port}"
    if REQUIRE:
        pytest.fail(f"{message} (CELERY_SAGAS_REQUIRE_SERVICES=1)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the real Redis store used by tests (``CELERY_SAGAS_TEST_REDIS``)."""
    need_service("Redis", "127.0.0.1", 6379)
    return REDIS_URL


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a 3-master Redis Cluster (``CELERY_SAGAS_TEST_REDIS_CLUSTER``): the one that
    answers there, or a private one this session starts on those ports (tests/redis_cluster.py)."""
    from tests.redis_cluster import RedisCluster, cluster_ok

    host, port = REDIS_CLUSTER_URL.split("://", 1)[1].split("/", 1)[0].split(",")[0].rsplit(":", 1)
    if _answers(host, int(port)) and cluster_ok(int(port)):
        yield REDIS_CLUSTER_URL
        return
    if host != "127.0.0.1" or shutil.which("redis-server") is None:
        need_service("Redis Cluster", host, int(port))
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"), int(port))
    try:
        cluster.start()
    except RuntimeError as exc:
        cluster.close()
        if REQUIRE:
            pytest.fail(f"cannot start a Redis Cluster: {exc}", pytrace=False)
        pytest.skip(f"cannot start a Redis Cluster: {exc}")
    try:
        yield cluster.url
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of the real PostgreSQL used by tests."""
    need_service("PostgreSQL", "127.0.0.1", 5432)
    return POSTGRES_URL


@pytest.fixture(scope="session")
def mysql_url() -> str:
    """URL of the real MariaDB/MySQL used by tests."""
    need_service("MariaDB", "127.0.0.1", 3306)
    return MYSQL_URL


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """URL of the real RabbitMQ broker used by tests."""
    need_service("RabbitMQ", "127.0.0.1", 5672)
    return RABBITMQ_URL


@pytest.fixture
def unique_prefix() -> Iterator[str]:
    """A fresh name prefix so tests never share keys or tables."""
    yield "t" + uuid.uuid4().hex[:12]
