"""Scan cost follows the matching records, not all records (docs/design.md §4.1).

Builds two stores side by side on each backend, under fresh prefixes:

- (a) ``--stale`` stale running sagas (default 1,000) and nothing else;
- (b) the same stale sagas plus ``--final`` final sagas (default 1,000,000; half completed,
  half compensated, all updated long before the staleness cut-off).

Then it times, alternating (a) and (b) so a busy machine slows both alike, one reconciliation
pass (``celery_sagas._sweep.sweep`` with every default pass, as beat runs it) and a scan-only
walk of the states that pass reads (stale ``running``, ``compensating``, ``manual-review``).
The stale sagas wait on a step running elsewhere, so a pass examines every one of them and
writes nothing: each repetition does the same work. It prints the median ratio (b)/(a) per
store (the target is at most 1.5), writes ``bench/results/scan_cost.json``, and removes
everything it created. Exit status 1 when a sweep ratio misses the target.

    .venv/bin/python bench/scan_cost.py                  # 1,000,000 final records
    .venv/bin/python bench/scan_cost.py --final 100000   # a quick run
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` and `celery_sagas` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import logging
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.bulk import add_store_arguments, destroy, load, open_store
from celery_sagas._codec import Codec
from celery_sagas._context import SagaContext
from celery_sagas._definitions import Registry, SagaDefinition, StepOptions, Timing
from celery_sagas._engine import Engine, EngineSettings
from celery_sagas._protocol.effects import marked
from celery_sagas._records import SagaRecord, SagaState, StepRecord, StepState
from celery_sagas._repository import SagaRepository
from celery_sagas._scans import Scans
from celery_sagas._sweep import Sweeper
from celery_sagas.stores.base import Envelope, Store
from celery_sagas.stores.redis import RedisStore
from celery_sagas.stores.sql import SqlStore
from celery_sagas.testing.dispatcher import RecordingDispatcher

TARGET = 1.5
STALE_MS = 30_000
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
CODEC = Codec()
TASKS = ("bench.reserve", "bench.charge", "bench.ship")
DEFINITION = "bench-order"
RESULTS = Path(__file__).resolve().parent / "results" / "scan_cost.json"


def _run(ctx: SagaContext, order: dict[str, Any]) -> None:
    for task in TASKS:
        ctx.step(task, order["id"])


def _registry() -> Registry:
    registry = Registry()
    for task in TASKS:
        registry.add_step(StepOptions(task=task, compensator=f"{task}.undo"))
    registry.add_definition(SagaDefinition(DEFINITION, _run))
    return registry


def _step(task: str, saga_id: str, n: int, state: StepState, at_ms: int) -> StepRecord:
    committed = state is not StepState.EXECUTING
    return StepRecord(
        name=task, task=task, effect_id=f"{saga_id}-{n}e", compensation_effect_id=f"{saga_id}-{n}c",
        state=state, args=(saga_id,), compensator=f"{task}.undo", attempts=1,
        result={"ref": f"{task}-{saga_id}"} if committed else None,
        started_at_ms=at_ms, claimed_by="another-host:1", dispatched_at_ms=at_ms,
        time_limit_ms=DAY_MS, committed_at_ms=at_ms if committed else None,
    )


def waiting_saga(saga_id: str, at_ms: int) -> SagaRecord:
    """Stale and running, its first step still running on another host within its time limit."""
    step = _step(TASKS[0], saga_id, 0, StepState.EXECUTING, at_ms)
    return SagaRecord(saga_id, DEFINITION, SagaState.RUNNING, {"id": saga_id}, at_ms, at_ms, (step,))


def final_body(state: SagaState, at_ms: int) -> str:
    """The JSON body of a realistic final saga (three steps, committed or compensated)."""
    step_state = StepState.COMMITTED if state is SagaState.COMPLETED else StepState.COMPENSATED
    steps = tuple(_step(task, "final", n, step_state, at_ms) for n, task in enumerate(TASKS))
    record = SagaRecord("final", DEFINITION, state, {"id": "final"}, at_ms, at_ms, steps)
    return CODEC.saga_envelope(marked(record, at_ms)).body


# ---------------------------------------------------------------------- loading


@dataclass
class Target:
    """One store under a fresh prefix and how many final records it holds."""

    name: str
    store: RedisStore | SqlStore
    final_ids: int = 0
    timings: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


def final_envelopes(count: int, now_ms: int) -> Iterator[Envelope]:
    """``count`` final sagas, half completed and half compensated, updated over the last 30 days."""
    base = now_ms - 30 * DAY_MS
    bodies = {state: final_body(state, base) for state in (SagaState.COMPLETED, SagaState.COMPENSATED)}
    states = list(bodies)
    for n in range(count):
        state = states[n % 2]
        at = base + (n * 29 * DAY_MS) // max(count, 1)
        yield Envelope("saga", f"final-{n:08d}", 4 + 2 * (n % 2), str(state), at, bodies[state],
                       label=DEFINITION)


# ---------------------------------------------------------------------- measuring


def sweep_once(sweeper: Sweeper, stale: int) -> None:
    """One full reconciliation pass, as beat runs it (with the metrics gauge's saga counts)."""
    report = sweeper.sweep()
    if not report.complete or report.examined != stale or report.acted or report.errors:
        raise RuntimeError(f"unexpected sweep: {report.examined} examined, {report.acted} acted, "
                           f"{report.errors} errors, complete={report.complete}")


def scan_once(store: Store, stale: int) -> None:
    """Walk every page of the states the sweep's saga passes read; nothing decoded."""
    before = int(time.time() * 1000) - STALE_MS
    found = 0
    for state, cut in (("running", before), ("compensating", None), ("manual-review", None)):
        cursor: str | None = None
        while True:
            page = store.scan("saga", [state], updated_before_ms=cut, cursor=cursor, limit=100)
            found += len(page.items)
            cursor = page.cursor
            if cursor is None:
                break
    if found != stale:
        raise RuntimeError(f"scan found {found} records, expected {stale}")


def timed(action: Callable[[], None]) -> float:
    """Seconds one call takes."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _sweeper(store: Store) -> Sweeper:
    """A sweeper as a worker builds it (metrics counts on), over ``store``."""
    repository = SagaRepository(store, CODEC)
    engine = Engine(repository, _registry(), RecordingDispatcher(),
                    settings=EngineSettings(timing=Timing(stale_ms=STALE_MS)))
    return Sweeper(engine, Scans(store, CODEC), owner="bench", lease_ms=600_000, count_states=True)


def measure(pair: tuple[Target, Target], stale: int, repeat: int) -> None:
    """Alternate (a) and (b), one warm-up round first; timings land in each target."""
    sweepers = [_sweeper(t.store) for t in pair]
    for round_ in range(repeat + 1):
        for target, sweeper in zip(pair, sweepers, strict=True):
            sweep_s = timed(lambda s=sweeper: sweep_once(s, stale))  # type: ignore[misc]
            scan_s = timed(lambda s=target.store: scan_once(s, stale))  # type: ignore[misc]
            if round_:
                target.timings["sweep"].append(sweep_s)
                target.timings["scan"].append(scan_s)


def summary(pair: tuple[Target, Target]) -> dict[str, Any]:
    """Medians and ratios of one backend."""
    a, b = pair
    out: dict[str, Any] = {"final_records": b.final_ids}
    for what in ("sweep", "scan"):
        med_a, med_b = statistics.median(a.timings[what]), statistics.median(b.timings[what])
        out[what] = {"a_median_s": med_a, "b_median_s": med_b, "ratio": med_b / med_a,
                     "a_runs_s": a.timings[what], "b_runs_s": b.timings[what]}
    return out


# ---------------------------------------------------------------------- main


def bench_backend(backend: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Build (a) and (b) on one backend, measure, clean up; returns its summary."""
    print(f"{backend}: {args.stale:,} stale sagas; (b) also holds {args.final:,} final sagas", flush=True)
    pair = (Target(backend, open_store(backend, url)), Target(backend, open_store(backend, url)))
    try:
        now = int(time.time() * 1000)
        for target in pair:
            stale = (CODEC.saga_envelope(waiting_saga(f"stale-{n:05d}", now - HOUR_MS + n))
                     for n in range(args.stale))
            load(target.store, stale, args.stale)
        pair[1].final_ids = args.final
        load_s = load(pair[1].store, final_envelopes(args.final, now), args.final)
        measure(pair, args.stale, args.repeat)
        result = summary(pair)
        result["load_final_s"] = load_s
    finally:
        for target in pair:
            destroy(target.store)
    for what in ("sweep", "scan"):
        r = result[what]
        verdict = "ok" if r["ratio"] <= TARGET else f"OVER {TARGET}"
        print(f"{backend}: {what:5s} (a) {r['a_median_s'] * 1000:8.1f} ms"
              f"  (b) {r['b_median_s'] * 1000:8.1f} ms  ratio (b)/(a) {r['ratio']:.2f}  [{verdict}]",
              flush=True)
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_store_arguments(parser, "redis,postgres")
    parser.add_argument("--stale", type=int, default=1_000, help="stale running sagas in both stores")
    parser.add_argument("--final", type=int, default=1_000_000, help="final sagas in store (b)")
    parser.add_argument("--repeat", type=int, default=9, help="timed rounds (median taken)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 1 when a sweep ratio misses the target."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # every stale saga is a finding: keep them off stderr
    urls = {"redis": args.redis, "postgres": args.postgres}
    results: dict[str, Any] = {}
    for backend in [s.strip() for s in args.stores.split(",") if s.strip()]:
        results[backend] = bench_backend(backend, urls[backend], args)
    document = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "stale": args.stale, "final": args.final, "repeat": args.repeat, "target": TARGET,
        "stores": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"results: {args.out}")
    return 0 if all(r["sweep"]["ratio"] <= TARGET for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
