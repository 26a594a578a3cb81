"""The run test_interrupted_run.py interrupts: a worker and a beat, then a long wait (collected
only when named on the command line: its name is not ``test_*.py``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.e2e.conftest import Stack
from tests.files import write_atomically


def test_a_worker_and_a_beat_then_a_long_wait(redis_stack: Stack) -> None:
    # given: the processes a run with end-to-end tests has running
    worker, beat = redis_stack.worker(), redis_stack.beat()

    # when: the outer test reads their pids, then interrupts this run
    write_atomically(Path(os.environ["INTERRUPTED_RUN_PIDS"]), json.dumps([worker.pid, beat.pid]))
    time.sleep(300)

    # then: the outer test asserts (this run never gets here)
    raise AssertionError("this run was to be interrupted")
