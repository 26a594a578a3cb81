"""The shipped race helpers: threads released together, racers that read together."""

from __future__ import annotations

from celery_sagas.stores.base import Envelope
from celery_sagas.stores.memory import MemoryStore
from celery_sagas.testing import ReadTogether, race

T0 = 1_700_000_000_000


def test_race_returns_each_result_or_error_in_thread_order() -> None:
    def call(i: int) -> int:
        if i == 2:
            raise ValueError("two")
        return i * 10

    results = race(call, threads=4)
    assert results[:2] == [0, 10] and results[3] == 30
    assert isinstance(results[2], ValueError)


def test_read_together_makes_every_racer_judge_the_same_version() -> None:
    store = MemoryStore()
    store.create(Envelope("saga", "s1", 1, "running", T0, "{}"))
    racing = ReadTogether(store, parties=8)

    def read_then_write(i: int) -> tuple[int, bool]:
        seen = racing.get("saga", "s1")
        assert seen is not None
        moved = Envelope("saga", "s1", seen.version + 1, "running", T0, f'{{"w":{i}}}')
        return seen.version, racing.compare_and_set(moved, seen.version)

    results = race(read_then_write, threads=8)
    assert {version for version, _ in results} == {1}  # type: ignore[misc]
    assert [won for _, won in results].count(True) == 1  # type: ignore[misc]
