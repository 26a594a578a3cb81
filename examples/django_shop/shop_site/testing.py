"""The test runner: a real prefork Celery worker on the test database for the whole run.

After Django created the test database (and ran every migration: the saga tables too), a
``celery -A shop_site worker`` starts with that database and a queue of its own; it is stopped,
and every connection to the test database closed, before the database is dropped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, connections
from django.test.runner import DiscoverRunner

HERE = Path(__file__).resolve().parents[1]


class WorkerTestRunner(DiscoverRunner):
    """Django's runner, with a worker between database setup and teardown."""

    worker: subprocess.Popen[bytes] | None = None

    def setup_databases(self, **kwargs: Any) -> Any:
        """Create the test database, then start the worker on it and on a queue of this run."""
        from shop_site.celery import app

        databases = super().setup_databases(**kwargs)
        self.queue = os.environ.get("SHOP_QUEUE") or f"django-shop-test-{settings.RUN_ID}"
        app.conf.task_default_queue = self.queue
        self.log = Path(tempfile.mkstemp(prefix="django-shop-worker-", suffix=".log")[1])
        env = {**os.environ, "SHOP_DB_NAME": connection.settings_dict["NAME"], "SHOP_QUEUE": self.queue,
               "DJANGO_SETTINGS_MODULE": "shop_site.settings"}
        with open(self.log, "wb") as log:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "shop_site", "worker", "--pool", "prefork",
                 "-c", "2", "-Q", self.queue, "-l", "INFO",
                 "--without-gossip", "--without-mingle", "--without-heartbeat"],
                cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self._wait_ready()
        return databases

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while "ready." not in self.log.read_text(errors="replace"):
            if self.worker is None or self.worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def teardown_databases(self, old_config: Any, **kwargs: Any) -> None:
        """Stop the worker and close the sagas' connections, then drop the test database."""
        from shop_site.celery import app, sagas

        if self.worker is not None and self.worker.poll() is None:
            os.killpg(self.worker.pid, signal.SIGTERM)
            try:
                self.worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.worker.pid, signal.SIGKILL)
                self.worker.wait()
        sagas.store.close()
        with app.connection_for_write() as broker:
            broker.default_channel.queue_delete(self.queue)
        connections.close_all()
        super().teardown_databases(old_config, **kwargs)
        self.log.unlink(missing_ok=True)
