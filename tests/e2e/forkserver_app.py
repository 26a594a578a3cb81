"""A Celery app for tests/e2e/test_forkserver.py: on import it prints what the fork server's
child was given (an environment variable and its working directory), and sleeps for
``FORKSERVER_SLEEP`` seconds when that is set."""

from __future__ import annotations

import os
import time

from celery import Celery

app = Celery("forkserver", broker="memory://")

print(f"FORKSERVER_TEST {os.environ.get('FORKSERVER_TEST')}", flush=True)
print(f"cwd {os.getcwd()}", flush=True)
if os.environ.get("FORKSERVER_SLEEP"):
    print("sleeping", flush=True)
    time.sleep(float(os.environ["FORKSERVER_SLEEP"]))
