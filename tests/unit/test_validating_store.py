"""ValidatingStore (docs/design.md §4.4): bad input is refused before any hook runs, and the
hooks get checked, normalised arguments."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from celery_sagas.errors import SagaValidationError
from celery_sagas.stores import MemoryStore
from celery_sagas.stores._validating import ValidatingStore
from celery_sagas.stores.base import Envelope, Fence, Lease, Page

GOOD = Envelope("saga", "s1", 1, "running", 1_000, "{}")
LEASE = Lease("sweep", "host-1", "tok", 2_000, 1)


class Recording(ValidatingStore):
    """Two buckets; every hook records its arguments and does nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    @property
    def buckets(self) -> int:
        return 2

    def bucket_of(self, record_id: str) -> int:
        return 0

    def close(self) -> None:
        pass

    def _record(self, name: str, *args: Any) -> Any:
        self.calls.append((name, args))
        return None

    def _create(self, envelope: Envelope) -> bool:
        return bool(self._record("create", envelope))

    def _get(self, kind: str, record_id: str) -> Envelope | None:
        return self._record("get", kind, record_id)  # type: ignore[no-any-return]

    def _compare_and_set(self, envelope: Envelope, expected_version: int, fence: Fence | None) -> bool:
        return bool(self._record("cas", envelope, expected_version, fence))

    def _annotate(self, kind: str, record_id: str, note: str, expected_version: int | None
                  ) -> Envelope | None:
        return self._record("annotate", kind, record_id, note, expected_version)  # type: ignore[no-any-return]

    def _delete(self, kind: str, record_id: str, expected_version: int, fence: Fence | None) -> bool:
        return bool(self._record("delete", kind, record_id, expected_version, fence))

    def _scan(self, kind: str, states: list[str], label: str | None, updated_before_ms: int | None,
              bucket: int | None, cursor: str | None, limit: int) -> Page:
        self._record("scan", kind, states, bucket)
        return Page((), None)

    def _scan_due(self, kind: str, due_before_ms: int, bucket: int | None, cursor: str | None,
                  limit: int) -> Page:
        self._record("scan_due", kind, due_before_ms, bucket)
        return Page((), None)

    def _count(self, kind: str, states: list[str], label: str | None, updated_after_ms: int | None,
               updated_before_ms: int | None) -> int:
        self._record("count", kind, states)
        return 0

    def _acquire_lease(self, name: str, owner: str, token: str, now_ms: int, expires_at_ms: int,
                       bucket: int) -> Lease | None:
        return self._record("acquire", name, now_ms, expires_at_ms, bucket)  # type: ignore[no-any-return]

    def _renew_lease(self, lease: Lease, now_ms: int, expires_at_ms: int) -> Lease | None:
        return self._record("renew", lease, now_ms, expires_at_ms)  # type: ignore[no-any-return]

    def _checkpoint_lease(self, lease: Lease, cursor: str | None, now_ms: int) -> bool:
        return bool(self._record("checkpoint", lease, cursor, now_ms))

    def _release_lease(self, lease: Lease) -> bool:
        return bool(self._record("release", lease))


BAD_CALLS: dict[str, Callable[[Recording], object]] = {
    "create: bad state": lambda s: s.create(Envelope("saga", "s1", 1, "no:colon", 1, "{}")),
    "create: notes": lambda s: s.create(Envelope("saga", "s1", 1, "running", 1, "{}", notes=("n",))),
    "get: bad kind": lambda s: s.get("Saga", "s1"),
    "get: bad id": lambda s: s.get("saga", "a b"),
    "cas: version not expected + 1": lambda s: s.compare_and_set(GOOD, 3),
    "cas: fence of another bucket": lambda s: s.compare_and_set(
        Envelope("saga", "s1", 2, "running", 1, "{}"), 1, fence=Fence("sweep", 1, 1)),
    "cas: fence bucket out of range": lambda s: s.compare_and_set(
        Envelope("saga", "s1", 2, "running", 1, "{}"), 1, fence=Fence("sweep", 1, 5)),
    "annotate: newline": lambda s: s.annotate("saga", "s1", "a\nb"),
    "annotate: version not an int": lambda s: s.annotate("saga", "s1", "n", expected_version="1"),  # type: ignore[arg-type]
    "delete: version not an int": lambda s: s.delete("saga", "s1", 1.0),  # type: ignore[arg-type]
    "delete_many: one bad item": lambda s: s.delete_many([("saga", "s1", 1), ("saga", "a b", 1)]),
    "scan: no states": lambda s: s.scan("saga", []),
    "scan: limit": lambda s: s.scan("saga", ["running"], limit=0),
    "scan: bucket": lambda s: s.scan("saga", ["running"], bucket=2),
    "scan_due: bucket": lambda s: s.scan_due("saga", due_before_ms=1, bucket=-1),
    "count: bad after": lambda s: s.count("saga", ["running"], updated_after_ms=-1),
    "acquire: lease name with braces": lambda s: s.acquire_lease("{x}", "o", "t", 1, 10),
    "acquire: bucket": lambda s: s.acquire_lease("sweep", "o", "t", 1, 10, bucket=2),
    "acquire: negative duration": lambda s: s.acquire_lease("sweep", "o", "t", 1, -10),
    "renew: lease of another bucket": lambda s: s.renew_lease(
        Lease("sweep", "o", "t", 2, 1, bucket=9), 1, 10),
    "checkpoint: cursor not a str": lambda s: s.checkpoint_lease(LEASE, 5, 1),  # type: ignore[arg-type]
    "release: bad owner": lambda s: s.release_lease(Lease("sweep", "a b", "t", 2, 1)),
}


@pytest.mark.parametrize("call", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_input_is_refused_before_any_hook_runs(call: Callable[[Recording], object]) -> None:
    store = Recording()
    with pytest.raises(SagaValidationError):
        call(store)
    assert store.calls == []


def test_hooks_get_the_states_without_repeats_and_the_lease_expiry() -> None:
    store = Recording()
    store.scan("saga", ["running", "done", "running"], bucket=1)
    store.count("saga", ["done", "done"])
    store.acquire_lease("sweep", "host-1", "tok", 1_000, 250, bucket=1)
    assert store.calls == [
        ("scan", ("saga", ["running", "done"], 1)),
        ("count", ("saga", ["done"])),
        ("acquire", ("sweep", 1_000, 1_250, 1)),
    ]


def test_delete_many_with_one_bad_item_deletes_nothing() -> None:
    store = MemoryStore()
    store.create(GOOD)
    items: Sequence[tuple[str, str, int]] = [("saga", "s1", 1), ("saga", "bad id", 1)]
    with pytest.raises(SagaValidationError):
        store.delete_many(items)
    assert store.get("saga", "s1") == GOOD
    assert store.delete_many([("saga", "s1", 1), ("saga", "absent", 1)]) == [True, False]
