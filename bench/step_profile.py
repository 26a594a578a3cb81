"""What one saga step costs in this process: function calls, store calls, publishes, CPU.

Runs 3-step sagas (no-op bodies) in-process with ``SagaDriver``: every step message goes to
its real task class (claim, body, settle, continuation) as in a worker, only the broker is
replaced by a recorder. The store is real (``--store``: a Redis or PostgreSQL URL, or
``memory://``), wrapped to count its calls. Reported per step (a saga's deliveries divided by
its steps; ``start()`` apart). The default path only: a step ``SagaDriver`` delivers has no
queue, so the next one never runs inline.

- ``calls``: Python function calls under ``cProfile`` (deterministic: machine load does not
  move them), and the calls of a few functions worth watching (replays, decisions, record
  copies, encodes, decodes);
- ``store``: store primitive calls; ``publishes``: messages sent;
- ``cpu_us``: client CPU (``time.process_time``), best of ``--batches`` batches without the
  profiler (moved by machine load: compare runs made together).

    python bench/step_profile.py --store redis://127.0.0.1:6379/13
    python bench/step_profile.py --store memory://

Runs on any checkout of the package, so the same command before and after a change compares
them (docs/performance.md, "Where the time goes").
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from celery import Celery

from celery_sagas import Sagas
from celery_sagas.stores import open_store
from celery_sagas.stores.base import Store
from celery_sagas.testing.driver import SagaDriver
from celery_sagas.testing.proxy import StoreProxy

# (file suffix, function name) of the calls counted apart, under a readable label (or several
# such pairs: the same work under another name in another version of the package).
WATCHED = {
    "replay of run": (("_context.py", "replay"),),
    "decide": (("decide.py", "decide"),),
    "Planner.plan": (("_planner.py", "plan"),),
    "record copies (replace)": (("dataclasses.py", "replace"), ("_frozen.py", "_replace")),
    "encode (saga_envelope)": (("_codec.py", "saga_envelope"),),
    "decode (Codec.saga)": (("_codec.py", "saga"),),
    "history (recorded)": (("history.py", "recorded"),),
    "announcer emit": (("_announcer.py", "emit"),),
    "logger calls": (("__init__.py", "isEnabledFor"),),
}


class Counting(StoreProxy):
    """Counts every store primitive called through it."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.counts: Counter[str] = Counter()

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if name in ("create", "get", "compare_and_set", "annotate", "delete", "scan"):
            counts = super().__getattribute__("counts")

            def counted(*args: Any, **kwargs: Any) -> Any:
                counts[name] += 1
                return attribute(*args, **kwargs)

            return counted
        return attribute


def build(store_url: str, steps: int) -> tuple[Sagas, SagaDriver, Counting, Any]:
    """A Sagas instance over a counted store, its driver, and the saga of ``steps`` steps."""
    app = Celery(f"profile-{uuid.uuid4().hex[:6]}", set_as_current=False)
    prefix = f"prof{uuid.uuid4().hex[:6]}"
    inner = open_store(store_url, key_prefix=prefix, table_prefix=prefix + "_", require_aof=False)
    store = Counting(inner)
    sagas = Sagas(app, store=store, allow_non_durable=True)
    driver = SagaDriver(sagas)
    names = [f"s{i}" for i in range(1, steps + 1)]

    @sagas.step(compensate=None)
    def noop(i: int, *, saga: Any = None) -> int:
        return i

    @sagas.saga("profile-saga")
    def chain(ctx: Any, data: Any) -> None:
        for i, name in enumerate(names):
            ctx.step(noop, i, step_name=name)

    return sagas, driver, store, chain


def run_batch(driver: SagaDriver, chain: Any, n: int,
              around_steps: Callable[[Callable[[], None]], None] = lambda f: f()) -> None:
    """Start ``n`` sagas, then deliver every message (inside ``around_steps``)."""
    for _ in range(n):
        chain.start({"order": "o-1", "qty": 2}, saga_id=str(uuid.uuid4()))
    around_steps(lambda: driver.run_until_idle())


def watched(stats: pstats.Stats) -> dict[str, int]:
    """Calls of each watched function."""
    found: Counter[str] = Counter()
    for (path, _, function), (_, calls, *_rest) in stats.stats.items():  # type: ignore[attr-defined]
        for label, names in WATCHED.items():
            if any(function == name and path.endswith(suffix) for suffix, name in names):
                found[label] += calls
    return dict(found)


def profile(args: argparse.Namespace) -> dict[str, Any]:
    """Counts and CPU per step."""
    _, driver, store, chain = build(args.store, args.steps)
    run_batch(driver, chain, args.warmup)
    steps = args.n * args.steps
    store.counts.clear()
    start_profiler, step_profiler = cProfile.Profile(), cProfile.Profile()
    for _ in range(args.n):
        start_profiler.runcall(chain.start, {"order": "o-1", "qty": 2}, saga_id=str(uuid.uuid4()))
    start_store = sum(store.counts.values())
    store.counts.clear()
    publishes = 0

    def deliver_all() -> None:
        nonlocal publishes
        while batch := driver.take():
            publishes += len(batch)
            for message in batch:
                step_profiler.runcall(driver.deliver, message)

    deliver_all()
    step_store = dict(store.counts)
    step_stats = pstats.Stats(step_profiler)
    start_stats = pstats.Stats(start_profiler)
    first_publishes = args.n  # start() sends each saga's first step
    cpu = []
    for _ in range(args.batches):
        began = time.process_time()
        run_batch(driver, chain, args.n)
        cpu.append(time.process_time() - began)
    return {
        "store": args.store.split("://")[0], "steps": args.steps,
        "sagas": args.n,
        "per_step": {
            "calls": round(step_stats.total_calls / steps, 1),  # type: ignore[attr-defined]
            "store": round(sum(step_store.values()) / steps, 2),
            "store_by_primitive": {k: round(v / steps, 2) for k, v in step_store.items()},
            "publishes": round((publishes - first_publishes) / steps, 2),
            "watched": {k: round(v / steps, 2) for k, v in watched(step_stats).items()},
        },
        "per_start": {
            "calls": round(start_stats.total_calls / args.n, 1),  # type: ignore[attr-defined]
            "store": round(start_store / args.n, 2),
        },
        "cpu_us_per_saga_best": round(min(cpu) / args.n * 1e6, 1),
        "cpu_us_per_step_best": round(min(cpu) / args.n / args.steps * 1e6, 1),
        "top": _top(step_stats, args.top, steps) if args.top else [],
    }


def _top(stats: pstats.Stats, count: int, steps: int) -> list[str]:
    """The ``count`` functions called most often, per step."""
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][1])  # type: ignore[attr-defined]
    return [f"{calls / steps:7.2f}  {path.rsplit('/', 1)[-1]}:{line} {function}"
            for (path, line, function), (_, calls, *_r) in rows[:count]]


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--n", type=int, default=200, help="sagas per batch")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--batches", type=int, default=5, help="timed batches (best is kept)")
    parser.add_argument("--top", type=int, default=0, help="also list the N most called functions")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    result = profile(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    per = result["per_step"]
    print(f"{result['store']}, {args.steps} steps, {args.n} sagas")
    print(f"per step: {per['calls']} function calls, {per['store']} store calls "
          f"{per['store_by_primitive']}, {per['publishes']} publishes, "
          f"{result['cpu_us_per_step_best']} us CPU (best of {args.batches})")
    print(f"per start(): {result['per_start']['calls']} function calls, "
          f"{result['per_start']['store']} store calls")
    for label, calls in sorted(per["watched"].items()):
        print(f"  {label:28} {calls:6.2f} per step")
    for row in result["top"]:
        print(row)


if __name__ == "__main__":
    main()
