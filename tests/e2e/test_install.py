"""What ``pip install 'celery-sagas[redis]'`` installs runs a worker on a Redis broker (issue 25
item 10: kombu's Redis transport imports ``packaging``, which only ``kombu[redis]`` brings).

Slow: it builds a fresh virtual environment (without the test environment's packages) and
installs the project into it, as a user does."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests import processes
from tests.conftest import REDIS_BROKER_URL, REDIS_URL, need_service
from tests.e2e.conftest import ROOT, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.redis]

APP = textwrap.dedent('''
    import os

    from celery import Celery

    from celery_sagas import Sagas

    app = Celery("installed", broker=os.environ["BROKER"])
    app.conf.task_default_queue = os.environ["QUEUE"]
    sagas = Sagas(app, store=os.environ["STORE"], key_prefix=os.environ["PREFIX"],
                  queue=os.environ["QUEUE"], require_aof=False)  # the test Redis has no AOF


    @sagas.step(compensate=None, name="installed.hello")
    def hello(name):
        return {"hello": name}


    @sagas.saga("installed-hello")
    def greet(ctx, data):
        return ctx.step(hello, data["name"])
''')

WAIT = textwrap.dedent('''
    import sys, time
    from installed_app import greet, sagas

    greet.start({"name": "pip"}, saga_id="hello-1")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        record = sagas.get("hello-1")
        if record is not None and record.state == "completed":
            print("RESULT", record.result)
            sys.exit(0)
        time.sleep(0.2)
    sys.exit("the saga did not complete")
''')


def _venv(folder: Path) -> Path:
    """A fresh venv with ``.[redis]`` installed from this checkout; its bin directory. The
    test environment's pip installs into it (``--python``): a venv of its own gets nothing
    more, and bootstrapping one took a third of this test's time."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True,
                   timeout=300)
    bin_dir = folder / "bin"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(bin_dir / "python"),
                           "install", "-q", f"{ROOT}[redis]"],
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return bin_dir


def test_the_redis_extra_installs_what_a_worker_on_a_redis_broker_needs(tmp_path: Path) -> None:
    # given: a fresh venv with celery-sagas[redis] and nothing else; an app on a Redis broker
    need_service("Redis", REDIS_BROKER_URL, 6379)
    bin_dir = _venv(tmp_path / "venv")
    (tmp_path / "installed_app.py").write_text(APP)
    queue = f"install_{uuid.uuid4().hex[:8]}"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(tmp_path),
           "BROKER": REDIS_BROKER_URL, "STORE": REDIS_URL, "QUEUE": queue,
           "PREFIX": queue, "HOME": os.environ.get("HOME", str(tmp_path))}
    log = tmp_path / "worker.log"

    # when: a worker starts there and a saga is started
    with log.open("wb") as out:
        worker = processes.spawn(
            [str(bin_dir / "celery"), "-A", "installed_app", "worker", "-P", "solo", "-Q", queue,
             "-n", f"{queue}@%h", "-l", "INFO", "--without-gossip", "--without-mingle",
             "--without-heartbeat"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: worker.poll() is not None or "ready." in log.read_text(errors="replace"),
                   timeout=120, what="the worker to start")
        assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
        done = subprocess.run([str(bin_dir / "python"), "-c", WAIT], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        processes.forget(worker)

    # then: the saga completed through that worker
    assert done.returncode == 0, done.stderr[-3000:] + log.read_text(errors="replace")[-3000:]
    assert "RESULT {'hello': 'pip'}" in done.stdout
