"""How tests run side by side (pytest-xdist) on services shared with other checkouts.

Every endpoint comes from its ``CELERY_SAGAS_TEST_*`` variable (README, Development). Inside one
run, each test writes under names of its own (a key or table prefix, a queue, a temporary
directory), tagged with the xdist worker that ran it, so tests on different workers never see
each other's records or messages on the shared Redis, PostgreSQL, MariaDB and RabbitMQ; the
Redis Cluster too (the one on the variable's ports, or the one the first worker to need it
starts there for the whole run). What cannot be shared is split by worker: the ports of
``CELERY_SAGAS_TEST_PORTS`` (worker ``i`` of ``n`` takes the ``i``-th of ``n`` equal slices).
"""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlsplit

__all__ = ["CLUSTER_NODES", "WORKER", "endpoint", "port_slice", "unique"]

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1"... or "" without xdist
INDEX = int(WORKER[2:]) if WORKER.startswith("gw") and WORKER[2:].isdigit() else 0
COUNT = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
CLUSTER_NODES = 6


def unique(prefix: str = "t", size: int = 12) -> str:
    """A name no other test of any worker uses: ``prefix``, the worker's index, random hex."""
    return f"{prefix}{INDEX}{uuid.uuid4().hex[:size - 1]}" if WORKER else \
        f"{prefix}{uuid.uuid4().hex[:size]}"


def endpoint(url: str, default_port: int) -> tuple[str, int]:
    """The first host and port a service URL names (a cluster URL names several nodes)."""
    netloc = urlsplit(url).netloc.rpartition("@")[2].split(",")[0]
    host, _, port = netloc.rpartition(":") if netloc.rpartition(":")[2].isdigit() else \
        (netloc, "", "")
    return (host or "127.0.0.1").strip("[]"), int(port) if port else default_port


def port_slice(ports: str) -> range | None:
    """This worker's share of a ``low-high`` port range (the whole range without xdist); None
    when unset."""
    if not ports:
        return None
    low_text, _, high_text = ports.partition("-")
    low, high = int(low_text), int(high_text or low_text)
    size = (high - low + 1) // COUNT
    if size < 1:
        raise RuntimeError(f"CELERY_SAGAS_TEST_PORTS={ports} has fewer ports than {COUNT} workers")
    first = low + INDEX * size
    return range(first, first + size)
