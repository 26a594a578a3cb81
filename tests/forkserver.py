"""A fork server for the ``celery worker`` and ``celery beat`` processes the tests start.

A ``celery`` command spends about 0.6 s of CPU importing Celery's command line, kombu, redis-py,
SQLAlchemy and this package before it reads its first option, and the suite starts several
hundred of them on two cores. Each pytest process therefore starts one fork server (``python -m
tests.forkserver``) that imports those modules once and then forks a child per command:

- the child is a new session (its own process group, as ``processes.spawn`` makes it), dies
  with the server (``PR_SET_PDEATHSIG``), writes to the test's log, takes the test's working
  directory, environment and ``sys.argv``, and runs ``celery.__main__.main()``: the code
  ``python -m celery -A app worker ...`` runs, from the same point on (the app module, read
  from the environment, is imported after the fork as before);
- it ends as an interpreter ends: ``atexit`` handlers, flushed streams, the exit status;
- the preloaded modules' objects are frozen out of the cyclic collector (``gc.freeze``), which
  Celery's prefork pool runs before every fork of a pool process.

The server answers each request with the child's pid and reports every child's exit status
when it reaps it; ``Forked`` gives the test the part of ``subprocess.Popen`` the tests use
(``pid``, ``poll``, ``wait``, ``returncode``). Every child is recorded with ``processes`` like
any spawned group, so an interrupted run ends them (tests/processes.py).

Only ``python -m celery`` commands go through it (``celery`` below); a test that checks how a
command starts (an install, the CLI's own imports) runs it with ``subprocess`` as before.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from tests import processes

__all__ = ["Forked", "celery"]

ROOT = Path(__file__).resolve().parents[1]

# What every ``celery`` command the tests run imports before reading the app module.
PRELOAD = (
    "celery.__main__", "celery.bin.celery", "celery.apps.worker", "celery.apps.beat",
    "celery.worker.consumer", "celery.concurrency.prefork", "kombu.transport.redis",
    "kombu.transport.pyamqp", "celery_sagas", "celery_sagas.stores.redis",
    "celery_sagas.stores.sql", "sqlalchemy.dialects.postgresql.psycopg",
)


class Forked:
    """A child of the fork server: the part of ``subprocess.Popen`` the tests use."""

    def __init__(self, server: _Server, pid: int, args: list[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = args

    @property
    def returncode(self) -> int | None:
        """The exit status once the child ended (negative: the signal that ended it)."""
        return self._server.status(self.pid)

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        return self._server.wait(self.pid, self.args, timeout)


class _Server:
    """The client side: one fork server per pytest process, started on first use."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self._proc = processes.spawn(
            [sys.executable, "-m", "tests.forkserver"], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        self._lock = threading.Lock()  # one request at a time: its pid is the next "pid" line
        self._changed = threading.Condition()
        self._pids: list[int] = []
        self._exits: dict[int, int] = {}
        threading.Thread(target=self._read, name="forkserver", daemon=True).start()

    def fork(self, args: list[str], cwd: Path, env: dict[str, str], log: Path) -> Forked:
        request = {"argv": args, "cwd": str(cwd), "env": env, "log": str(log)}
        with self._lock:
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(request).encode() + b"\n")
            self._proc.stdin.flush()
            pid = self._next_pid()
        processes.track(pid)
        return Forked(self, pid, args)

    def _next_pid(self) -> int:
        with self._changed:
            if not self._changed.wait_for(lambda: self._pids or self._proc.poll() is not None,
                                          timeout=60):
                raise RuntimeError("the fork server did not answer in 60 s")
            if not self._pids:
                raise RuntimeError(f"the fork server ended ({self._proc.returncode})")
            return self._pids.pop(0)

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            kind, *values = line.split()
            with self._changed:
                if kind == b"pid":
                    self._pids.append(int(values[0]))
                else:
                    self._exits[int(values[0])] = int(values[1])
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def status(self, pid: int) -> int | None:
        with self._changed:
            if pid not in self._exits and self._proc.poll() is not None and _gone(pid):
                # The server ended first (an interrupted run kills it with the children):
                # nobody will report this exit, and only SIGKILL ends a child that way.
                self._exits[pid] = -signal.SIGKILL
            return self._exits.get(pid)

    def wait(self, pid: int, args: list[str], timeout: float | None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.status(pid)) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(args, timeout or 0.0)
            with self._changed:
                self._changed.wait(0.05 if left is None else min(left, 0.05))
        return code


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie waiting for its new parent counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


_server: _Server | None = None
_server_lock = threading.Lock()


def celery(args: list[str], cwd: Path, env: dict[str, str], log: Path) -> Forked:
    """Run ``python -m celery *args`` (``args`` without the interpreter and ``-m celery``) in a
    child of this process's fork server, its output in ``log`` (emptied first)."""
    global _server
    log.write_bytes(b"")
    with _server_lock:
        if _server is None or _server._proc.poll() is not None:
            _server = _Server()
        server = _server
    return server.fork([sys.executable, "-m", "celery", *args], cwd, env, log)


# --- the server process -------------------------------------------------------------------


def _write(line: str) -> None:
    os.write(1, line.encode() + b"\n")


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become the command, run it, and end as an interpreter does."""
    code = 1
    try:
        os.setsid()
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, 1 << 16)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        main = sys.modules["celery.__main__"]
        sys.argv = [str(main.__file__), *request["argv"][3:]]
        code = _run(main.main)
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def _run(main: Any) -> int:
    """Call ``main`` and turn how it ended into an exit status, as the interpreter does."""
    try:
        main()
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _write(f"exit {pid} {os.waitstatus_to_exitcode(status)}")


def serve() -> None:
    """Import what every command imports, then fork one child per request line on stdin."""
    for name in PRELOAD:
        importlib.import_module(name)
    assert threading.active_count() == 1, "a preloaded module started a thread"
    # Celery's prefork pool runs gc.collect() before it forks each pool process (celery#2927),
    # and each rescanned every preloaded object: a third of the children's CPU. Frozen, they
    # stay out of every collection of the children; they are modules, never garbage.
    gc.collect()
    gc.freeze()
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.05)
        if ready:
            data = os.read(0, 1 << 16)
            if not data:
                return  # the pytest process is gone; processes.py ends the children
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(request)
                _write(f"pid {pid}")
        _reap()


if __name__ == "__main__":
    serve()
