"""The Redis key layout (stores/redis/keys.py): pure, stable, one hash slot per record."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest

from celery_sagas.errors import SagaValidationError
from celery_sagas.stores.redis import _keys as keys
from celery_sagas.stores.redis._keys import KeyLayout, bucket_of, check_buckets, check_prefix


def _crc16(data: bytes) -> int:
    """CRC16-XMODEM as Redis Cluster uses it for key slots."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def cluster_slot(key: str) -> int:
    """The Redis Cluster slot of a key, honouring a non-empty ``{hash tag}``."""
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return _crc16(key.encode()) % 16384


# ---------------------------------------------------------------- buckets


@pytest.mark.parametrize(
    ("record_id", "buckets", "expected"),
    [("order-42", 16, 14), ("a", 16, 3), ("saga-0001", 16, 2), ("order-42", 1024, 734)],
)
def test_the_bucket_of_an_id_is_pinned_crc32_modulo_the_count(
    record_id: str, buckets: int, expected: int
) -> None:
    """Given an id, when bucketed, then the bucket is CRC-32 mod N on every process and release."""
    assert bucket_of(record_id, buckets) == expected


def test_buckets_spread_ids_evenly() -> None:
    counts = [0] * 16
    for n in range(16_000):
        counts[bucket_of(f"saga-{n}", 16)] += 1
    assert min(counts) > 850 and max(counts) < 1150, counts


def test_a_single_bucket_holds_everything() -> None:
    assert {bucket_of(f"id-{n}", 1) for n in range(100)} == {0}


# ---------------------------------------------------------------- key names


def test_record_and_index_keys_have_the_documented_shape() -> None:
    layout = KeyLayout("shop:sagas", 16)
    assert layout.record("saga", "order-42") == "{shop:sagas:14}:r:saga:order-42"
    assert layout.record_index("saga", "order-42", "running") == "{shop:sagas:14}:s:saga:running"
    assert layout.index("saga", "running", 3, "place-order") == "{shop:sagas:3}:l:saga:running:place-order"
    assert layout.index("approval", "pending", 3) == "{shop:sagas:3}:s:approval:pending"
    assert layout.due("saga", 5) == "{shop:sagas:5}:d:saga"


def test_lease_keys_have_the_documented_shape() -> None:
    assert KeyLayout("sagas", 16).lease("sweep", 7) == "{sagas:7}:lease:sweep"


@pytest.mark.parametrize("record_id", ["order-42", "a", "x" * 255, "weird:id|~!", "saga-0001"])
def test_every_key_of_a_bucket_shares_one_cluster_slot(record_id: str) -> None:
    """One saga, one slot: its record, its indexes, the due index and the bucket's leases."""
    layout = KeyLayout("sagas", 16)
    bucket = layout.bucket(record_id)
    keys = [layout.record("saga", record_id), layout.record("approval", record_id),
            layout.due("saga", bucket), layout.lease("celery_sagas.sweep", bucket)]
    for state in ("running", "compensating", "manual-review", "completed"):
        keys.append(layout.record_index("saga", record_id, state))
        keys.append(layout.record_index("saga", record_id, state, "place-order"))
    assert len({cluster_slot(key) for key in keys}) == 1


def test_different_buckets_land_in_different_slots() -> None:
    layout = KeyLayout("sagas", 16)
    slots = {cluster_slot(layout.index("saga", "running", b)) for b in range(16)}
    assert len(slots) == 16


def test_kinds_labels_and_prefixes_never_share_a_key() -> None:
    a = KeyLayout("p", 4)
    b = KeyLayout("p2", 4)
    names = {a.record("saga", "x"), a.record("approval", "x"), b.record("saga", "x"),
             a.lease("x", 0), a.index("saga", "running", 0), a.index("saga", "running", 0, "x"),
             a.index("saga", "running", 0, "running"), a.due("saga", 0)}
    assert len(names) == 8


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("prefix", ["sagas", "shop:sagas", "a.b-c_1", "9lives", "x" * 64])
def test_prefixes_of_letters_digits_and_separators_are_accepted(prefix: str) -> None:
    assert check_prefix(prefix) == prefix
    assert KeyLayout(prefix).prefix == prefix


@pytest.mark.parametrize(
    "prefix",
    ["", "{tag}", "a}b", "a b", "a\nb", "-lead", ":lead", "x" * 65, "a*b", "a?b", "caf\u00e9", None, 7],
)
def test_prefixes_that_could_break_a_hash_tag_or_a_pattern_are_refused(prefix: object) -> None:
    with pytest.raises(SagaValidationError):
        check_prefix(prefix)
    with pytest.raises(SagaValidationError):
        KeyLayout(prefix)  # type: ignore[arg-type]


@pytest.mark.parametrize("buckets", [0, -1, 1025, True, "16", 1.0, None])
def test_bucket_counts_outside_1_to_1024_are_refused(buckets: object) -> None:
    with pytest.raises(SagaValidationError):
        check_buckets(buckets)


@pytest.mark.parametrize("buckets", [1, 16, 1024])
def test_bucket_counts_inside_the_range_are_accepted(buckets: int) -> None:
    assert KeyLayout("sagas", buckets).buckets == buckets


@pytest.mark.parametrize("part", ["a b", "a\nb", "", "caf\u00e9", "nul\x00"])
def test_a_key_part_that_could_escape_its_hash_tag_is_refused(part: str) -> None:
    """The store validates first; the layout still never builds such a key."""
    layout = KeyLayout("sagas", 16)
    with pytest.raises(SagaValidationError):
        layout.record("saga", part)
    with pytest.raises(SagaValidationError):
        layout.record("saga" if part else "x{", part or "id")
    with pytest.raises(SagaValidationError):
        layout.index("saga", part, 0)
    with pytest.raises(SagaValidationError):
        layout.index("saga", "running", 0, part)
    with pytest.raises(SagaValidationError):
        layout.lease(part, 0)


@pytest.mark.parametrize("state", ["a:b", "a{b", "a}b"])
def test_a_state_that_could_blur_an_index_name_is_refused(state: str) -> None:
    with pytest.raises(SagaValidationError):
        KeyLayout("sagas", 16).index("saga", state, 0)


@pytest.mark.parametrize("bucket", [-1, 16])
def test_a_bucket_outside_the_layout_is_refused(bucket: int) -> None:
    with pytest.raises(SagaValidationError):
        KeyLayout("sagas", 16).index("saga", "running", bucket)


def test_the_cleanup_pattern_matches_only_this_prefix() -> None:
    import fnmatch

    layout = KeyLayout("t1", 4)
    pattern = layout.pattern()
    assert fnmatch.fnmatchcase(layout.record("saga", "x"), pattern)
    assert fnmatch.fnmatchcase(layout.lease("x", 3), pattern)
    assert not fnmatch.fnmatchcase(KeyLayout("t10", 4).record("saga", "x"), pattern)
    assert not fnmatch.fnmatchcase(KeyLayout("t1:x", 4).record("saga", "x"), pattern)


# ---------------------------------------------------------------- purity


def test_the_key_module_imports_only_the_standard_library_and_project_errors() -> None:
    tree = ast.parse(Path(keys.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + (node.module or ""))
    relative = {name for name in imported if name.startswith(".")}
    assert relative == {"...errors"}
    absolute = imported - relative - {"__future__"}
    assert absolute <= set(sys.stdlib_module_names), absolute
    assert not absolute & {"time", "random", "logging", "secrets", "os"}


@pytest.mark.parametrize("part", ["a{b", "a}b", "{tag}"])
def test_braces_are_refused_inside_the_hash_tag_only(part: str) -> None:
    """Redis hashes the first "{...}": ids and labels come after the tag, leases never hold one."""
    layout = KeyLayout("sagas", 16)
    record = layout.record("saga", part)
    assert record.startswith(layout.tag(layout.bucket(part)) + ":r:saga:")
    assert layout.index("saga", "running", 0, part) == layout.tag(0) + f":l:saga:running:{part}"
    with pytest.raises(SagaValidationError):
        layout.lease(part, 0)
    with pytest.raises(SagaValidationError):
        layout.record(part, "id")


def test_every_key_of_a_bucket_is_in_one_slot_of_a_real_cluster(redis_cluster_url: str) -> None:
    """One bucket, one slot, as the cluster itself hashes the keys (CLUSTER KEYSLOT)."""
    from celery_sagas.stores import open_store

    store: Any = open_store(redis_cluster_url, key_prefix="shop:sagas", require_aof=False)
    try:
        layout = store.layout
        slots_of_buckets = set()
        for bucket in range(layout.buckets):
            record_id = next(f"id-{n}" for n in range(10_000) if layout.bucket(f"id-{n}") == bucket)
            keys = [
                layout.record("saga", record_id), layout.record("approval", record_id),
                layout.index("saga", "running", bucket), layout.index("saga", "done", bucket, "l1"),
                layout.due("saga", bucket), layout.lease("sweep", bucket),
            ]
            slots = {store._client.cluster_keyslot(key) for key in keys}
            assert len(slots) == 1, (bucket, keys, slots)
            slots_of_buckets |= slots
        assert len(slots_of_buckets) == layout.buckets  # the buckets spread over the cluster
    finally:
        store.close()
