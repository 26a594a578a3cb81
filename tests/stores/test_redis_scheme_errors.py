"""A Redis URL whose scheme does not fit the server says so and names the fix (issue 25 item
11): ``redis+cluster://`` to a plain Redis said only ``RedisClusterException``; ``redis://`` to a
cluster said ``MovedError: 2656 …``."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from celery_sagas.errors import StoreError
from celery_sagas.stores import open_store

pytestmark = pytest.mark.redis


def test_a_cluster_url_to_a_plain_redis_says_cluster_mode_is_disabled_there(redis_url: str) -> None:
    # given: the address of a plain Redis, written as a cluster URL
    host_port = redis_url.split("://", 1)[1].split("/", 1)[0]

    # when / then
    with pytest.raises(StoreError, match=r"cluster mode is disabled on that server.*use a redis:// URL"):
        open_store(f"redis+cluster://{host_port}/")


def test_a_plain_url_to_a_cluster_node_says_to_use_redis_cluster(redis_cluster_url: str) -> None:
    # given: one node of a Redis Cluster, written as a plain Redis URL
    first = redis_cluster_url.split("://", 1)[1].split("/", 1)[0].split(",")[0]
    # require_aof=False: the test cluster's nodes run without AOF (test_durability.py)
    store: Any = open_store(f"redis://{first}/0", key_prefix="scheme" + uuid.uuid4().hex[:8],
                            require_aof=False)
    try:
        # when: a record in each bucket is read (the buckets spread over the cluster's masters)
        layout = store.layout
        ids = [next(f"id-{n}" for n in range(10_000) if layout.bucket(f"id-{n}") == bucket)
               for bucket in range(layout.buckets)]
        # MovedError on redis-py 5.1+, a ResponseError "MOVED ..." on 5.0 (the floor)
        with pytest.raises(StoreError, match=r"(MovedError|MOVED).*use a redis\+cluster:// URL"):
            for record_id in ids:
                store.get("saga", record_id)
    finally:
        store.close()
