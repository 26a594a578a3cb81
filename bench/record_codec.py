"""What a saga write costs in this process: encode, decode and history per record (issue 26).

Runs a saga of ``--steps`` steps in-process (memory store, no broker) and records every saga
record the repository writes. Then, for each written record, times with ``timeit``:

- ``encode``: ``codec.saga_envelope(record, stamp=True)`` (what every compare-and-set sends);
- ``decode``: ``codec.saga(envelope)`` (what every read does, notes applied);
- ``read+write``: decode then encode, the entries' encoded text not cached (a worker that
  takes a saga another worker wrote last);
- ``history``: ``recorded(before, after)``, the history derivation of that write (absent
  before issue 26).

It prints the mean per write (microseconds) and the final record's body size. Runs on any
checkout of the package (the history line is left out where there is none), so the same
command before and after a change compares them on the same machine:

    python bench/record_codec.py --steps 3 --repeat 2000
    git stash; python bench/record_codec.py --steps 3 --repeat 2000; git stash pop

bench/throughput.py measures what this costs end to end (saga/chain on real workers).
"""

from __future__ import annotations

import argparse
import timeit
import uuid
from typing import Any

from celery import Celery

from celery_sagas import MemoryStore, Sagas
from celery_sagas._records import SagaRecord
from celery_sagas.testing.driver import SagaDriver

try:
    from celery_sagas._history_codec import _text
    from celery_sagas._protocol.history import recorded
except ImportError:  # a checkout from before the history
    recorded = _text = None  # type: ignore[assignment]


def _cold() -> None:
    """Forget the entries' encoded text, as a worker that did not write them before."""
    if _text is not None:
        _text.cache_clear()


def written_records(steps: int) -> tuple[Sagas, list[tuple[SagaRecord, SagaRecord]]]:
    """Run one saga of ``steps`` steps; every (before, after) pair the repository wrote."""
    app = Celery(f"bench-{uuid.uuid4().hex[:6]}", set_as_current=False)
    sagas = Sagas(app, store=MemoryStore(), allow_non_durable=True)
    driver = SagaDriver(sagas)

    @sagas.step(compensate=None)
    def work(n: int, *, saga: Any = None) -> dict[str, Any]:
        return {"n": n, "note": "a result of a typical size " * 2}

    @sagas.saga("bench-chain")
    def chain(ctx: Any, data: dict[str, Any]) -> Any:
        return [ctx.step(work, i) for i in range(data["steps"])]

    pairs: list[tuple[SagaRecord, SagaRecord]] = []
    repository = sagas.engine.repository
    inner = repository._compare_and_set

    def spy(before: SagaRecord, after: SagaRecord, *args: Any, **kwargs: Any) -> Any:
        stored = inner(before, after, *args, **kwargs)
        if stored is not None:
            pairs.append((before, stored))
        return stored

    repository._compare_and_set = spy  # type: ignore[method-assign]
    chain.start({"steps": steps, "order": {"id": "o-1", "sku": "sku-1", "qty": 2}},
                saga_id="bench-1")
    driver.run_until_idle()
    assert sagas.get("bench-1").state == "completed"  # type: ignore[union-attr]
    return sagas, pairs


def per_write_us(stmt: Any, pairs: list[Any], repeat: int) -> float:
    """Mean microseconds of ``stmt(pair)`` over every pair."""
    total = sum(timeit.timeit(lambda p=p: stmt(p), number=repeat) for p in pairs)
    return total / repeat / len(pairs) * 1e6


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    sagas, pairs = written_records(args.steps)
    codec = sagas.engine.repository.codec
    envelopes = [codec.saga_envelope(after, stamp=True) for _, after in pairs]
    encode = per_write_us(lambda p: codec.saga_envelope(p[1], stamp=True), pairs, args.repeat)
    decode = per_write_us(lambda e: codec.saga(e, "bench-1"), envelopes, args.repeat)
    def roundtrip(envelope: Any) -> Any:
        _cold()
        return codec.saga_envelope(codec.saga(envelope, "bench-1"), stamp=True)

    cold = per_write_us(roundtrip, envelopes, args.repeat)
    print(f"writes per saga: {len(pairs)}; final body: {len(envelopes[-1].body)} bytes")
    print(f"read+write {cold:7.1f} us per write (decode, then encode in a process that never "
          "wrote its entries)")
    print(f"encode  {encode:7.1f} us per write")
    print(f"decode  {decode:7.1f} us per write")
    if recorded is not None:
        derive = per_write_us(lambda p: recorded(p[0], p[1]), pairs, args.repeat)
        print(f"history {derive:7.1f} us per write "
              f"({len(pairs[-1][1].history)} entries at the end)")


if __name__ == "__main__":
    main()
