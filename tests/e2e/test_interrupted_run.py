"""A test run stopped by SIGTERM (a CI timeout) or SIGINT (Ctrl-C) ends every process its tests
started: celery workers with their pool children, and beat (tests/processes.py), with and
without xdist workers in between."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import processes
from tests.e2e.conftest import ROOT, wait_until


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.parametrize(("signum", "xdist_workers"), [
    (signal.SIGTERM, "0"), (signal.SIGINT, "0"), (signal.SIGTERM, "1"), (signal.SIGINT, "1"),
], ids=["sigterm", "sigint", "sigterm-xdist", "sigint-xdist"])
def test_an_interrupted_run_leaves_no_worker_or_beat_behind(
        redis_url: str, tmp_path: Path, signum: int, xdist_workers: str) -> None:
    # given: a pytest run whose test started a worker (2 pool children) and a beat
    pids_file = tmp_path / "pids.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CUR"))}
    env["INTERRUPTED_RUN_PIDS"] = str(pids_file)
    with open(tmp_path / "run.log", "wb") as log:
        run = processes.spawn(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", xdist_workers,
             "tests/e2e/interrupted_run.py"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: pids_file.exists() or run.poll() is not None, timeout=120,
                   what="the worker and beat of the inner run")
        assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        started = json.loads(pids_file.read_text())
        wait_until(lambda: len(_children(started[0])) == 2, what="the worker's pool children")
        started += _children(started[0])

        # when
        os.kill(run.pid, signum)
        run.wait(timeout=60)

        # then
        wait_until(lambda: not [pid for pid in started if _alive(pid)], timeout=30,
                   what=f"every process of the run ended ({started})")
        assert run.returncode != 0
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        processes.forget(run)
