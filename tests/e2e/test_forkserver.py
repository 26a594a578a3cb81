"""The fork server the tests start ``celery`` commands from (tests/forkserver.py) behaves as
``subprocess.Popen`` of ``python -m celery`` does: the child has the test's environment and
working directory, and its exit status, a signal's included, reaches ``poll`` and ``wait``."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests import forkserver, processes
from tests.e2e.conftest import ROOT, wait_until


def test_a_command_runs_with_the_tests_environment_and_reports_its_exit(tmp_path: Path) -> None:
    log = tmp_path / "report.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FORKSERVER_TEST": "seen"}
    done = forkserver.celery(["-A", "tests.e2e.forkserver_app", "report"], tmp_path, env, log)
    assert done.wait(timeout=60) == 0, log.read_text()
    text = log.read_text()
    assert "FORKSERVER_TEST seen" in text and f"cwd {tmp_path}" in text, text
    missing = forkserver.celery(["-A", "tests.no_such_app", "report"], tmp_path, env, log)
    assert missing.wait(timeout=60) != 0
    assert "tests.no_such_app" in log.read_text()


def test_a_running_child_is_polled_waited_for_and_killed_as_a_group(tmp_path: Path) -> None:
    log = tmp_path / "sleep.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FORKSERVER_SLEEP": "60"}
    child = forkserver.celery(["-A", "tests.e2e.forkserver_app", "report"], tmp_path, env, log)
    wait_until(lambda: "sleeping" in log.read_text(), what="the child running")
    assert child.poll() is None and child.pid in processes.tracked()
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    processes.forget(child)
