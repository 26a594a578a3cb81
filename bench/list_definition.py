"""How long ``celery sagas list --definition X`` takes with 200,000 sagas in the store.

Under a fresh prefix it loads ``--sagas`` saga records in the store's own layout with the web
benchmark's loader (``bench.web_pages``: three definitions weighted 7:2:1, 95% completed, each
record labelled with its definition), then runs the ``list`` command in-process through
click's runner against a Sagas over that store: for each definition, the first page (50 sagas,
every state), the second page (its ``--cursor``), and the first page of one state
(``--state manual-review``). It counts the store primitives each run calls (one ``scan`` of
the label index: the filter runs in the store) and prints the median and slowest of
``--repeat`` runs, with the load average. Writes ``bench/results/list_definition.json`` and
removes what it loaded.

    .venv/bin/python bench/list_definition.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/wt3
    .venv/bin/python bench/list_definition.py --sagas 20000 --stores redis --redis redis://127.0.0.1:6379/3
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` and `celery_sagas` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import statistics
import time
from typing import Any

from celery.bin.base import CLIContext
from click.testing import CliRunner

from bench.bulk import add_store_arguments, destroy, load, open_store
from bench.common import git_commit, machine, write_json
from bench.web_pages import DEFINITIONS, CallCounter, envelopes, facade
from celery_sagas.cli import sagas as sagas_command

RESULTS = Path(__file__).resolve().parent / "results" / "list_definition.json"
TARGET_MS = 300.0


def run_list(counter: CallCounter, app: Any, *args: str) -> tuple[float, dict[str, Any], dict[str, int]]:
    """One `celery sagas list ARGS --json`: (ms, its JSON, the primitives it called)."""
    counter.taken()
    started = time.perf_counter()
    result = CliRunner().invoke(sagas_command, ["list", *args, "--json"],
                                obj=CLIContext(app=app, no_color=True, workdir=None))
    elapsed = (time.perf_counter() - started) * 1000
    assert result.exit_code == 0, result.output
    return elapsed, json.loads(result.stdout), counter.taken()


def time_case(counter: CallCounter, app: Any, args: list[str], repeat: int) -> dict[str, Any]:
    """The median and slowest of ``repeat`` runs after one warm-up, with what the first did."""
    _, first, calls = run_list(counter, app, *args)
    times = [run_list(counter, app, *args)[0] for _ in range(repeat)]
    return {"args": args, "median_ms": round(statistics.median(times), 1),
            "max_ms": round(max(times), 1), "calls": calls, "rows": len(first["sagas"]),
            "cursor": first["cursor"]}


def bench_store(backend: str, url: str, count: int, repeat: int) -> dict[str, Any]:
    """Load ``count`` sagas, time every case, remove them."""
    store = open_store(backend, url)
    try:
        print(f"{backend}: loading {count:,} sagas", flush=True)
        loaded_s = load(store, envelopes(count, int(time.time() * 1000)), count)
        counter = CallCounter(store)
        app = facade(counter).app
        cases: dict[str, Any] = {}
        for name, _ in DEFINITIONS:
            first = time_case(counter, app, ["--definition", name], repeat)
            assert first["cursor"] is not None
            second = time_case(counter, app, ["--definition", name, "--cursor", first["cursor"]],
                               repeat)
            review = time_case(counter, app, ["--definition", name, "--state", "manual-review"],
                               repeat)
            cases[name] = {"first page": first, "second page": second, "manual-review": review}
            for label, case in cases[name].items():
                print(f"  list --definition {name:<13} {label:<14} median {case['median_ms']:7.1f} ms"
                      f"  max {case['max_ms']:7.1f} ms  rows {case['rows']:3d}  calls {case['calls']}",
                      flush=True)
        return {"sagas": count, "load_s": round(loaded_s, 1), "cases": cases}
    finally:
        destroy(store)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_store_arguments(parser, "postgres")
    parser.add_argument("--sagas", type=int, default=200_000, help="sagas in each store")
    parser.add_argument("--repeat", type=int, default=9, help="timed runs per case (median taken)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 1 when a median misses the target."""
    args = _parser().parse_args(argv)
    results: dict[str, Any] = {"commit": git_commit(), "machine": machine(),
                               "load_average": os.getloadavg(), "target_ms": TARGET_MS}
    missed = False
    for backend in args.stores.split(","):
        url = args.redis if backend == "redis" else args.postgres
        results[backend] = bench_store(backend, url, args.sagas, args.repeat)
        missed |= any(case["median_ms"] > TARGET_MS for per in results[backend]["cases"].values()
                      for case in per.values())
    print(f"load average {os.getloadavg()}")
    write_json(args.out, results)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
