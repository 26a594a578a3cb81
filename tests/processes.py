"""Every process the tests start ends with the run, also when the run is interrupted.

``spawn`` starts a child in its own session (so a signal meant for one test's worker never
reaches pytest) and records its process group. ``install`` (tests/conftest.py calls it in every
pytest process, the xdist controller and its workers alike) makes SIGTERM and SIGINT end them:

- SIGTERM: SIGKILL every recorded group, pass SIGTERM on to this process's own children (the
  xdist workers, a helper script a test runs), then die of SIGTERM as if nothing was caught;
- SIGINT: the same for the groups and children, then pytest's usual ``KeyboardInterrupt``;
- at exit (``atexit`` and the session's end): SIGKILL whatever group is still recorded.

A server that detaches itself (``pg_ctl start``) is in no group of ours: its owner registers a
stop with ``at_end``, called on SIGTERM, SIGINT and at exit.

Children started from the main thread also get ``PR_SET_PDEATHSIG`` (SIGKILL when pytest dies,
even of SIGKILL); a script that starts servers to outlive it (``python -m tests.redis_cluster
start``) never calls ``install``, so nothing of this applies there.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["at_end", "forget", "install", "kill_all", "spawn", "track", "tracked", "unused_pid"]

_PR_SET_PDEATHSIG = 1
_groups: set[int] = set()
_lock = threading.Lock()
_installed = False
_at_end: list[Callable[[], None]] = []


def unused_pid(start: int = 4_000_000) -> int:
    """A pid no process of this pid namespace has (a process known to be gone)."""
    pid = start
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def tracked() -> set[int]:
    """The process groups started and not yet ended (a copy)."""
    with _lock:
        return set(_groups)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(args: list[str], **options: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, **options)`` in a new session whose group ends with the run."""
    tie = _installed and sys.platform == "linux" \
        and threading.current_thread() is threading.main_thread()
    proc: subprocess.Popen[Any] = subprocess.Popen(
        args, start_new_session=True, preexec_fn=_die_with_parent if tie else None, **options
    )
    track(proc.pid)
    return proc


def track(group: int) -> None:
    """Record a process group started elsewhere (a fork server's child) to end with the run."""
    with _lock:
        _groups.add(group)


def forget(proc: Any) -> None:
    """Stop tracking ``proc``'s group (it was ended and reaped by its owner): a ``Popen``, or a
    fork server's child (anything with a ``pid``)."""
    with _lock:
        _groups.discard(proc.pid)


def kill_all() -> None:
    """SIGKILL every recorded process group."""
    with _lock:
        groups = list(_groups)
        _groups.clear()
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


def _children() -> list[int]:
    """Pids whose parent is this process (from /proc; empty where there is none)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            if int(stat.rpartition(")")[2].split()[1]) == me:
                found.append(int(entry.name))
    return found


def at_end(callback: Callable[[], None]) -> None:
    """Also call ``callback`` when SIGTERM, SIGINT or the exit ends the run (a detached or
    run-wide server's stop; it must be harmless when that server is already gone)."""
    _at_end.append(callback)


def _run_callbacks() -> None:
    kill_all()
    while _at_end:
        with contextlib.suppress(Exception):
            _at_end.pop()()


def _end_everything() -> None:
    _run_callbacks()
    for child in _children():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGTERM)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _end_everything()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _end_everything()
    signal.default_int_handler(signum, frame)


def install() -> None:
    """End every spawned process at exit, and on SIGTERM and SIGINT (handlers need the main
    thread); idempotent."""
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(_run_callbacks)
    if threading.current_thread() is not threading.main_thread():
        return
    handlers: dict[int, Callable[[int, FrameType | None], None]] = {
        signal.SIGTERM: _on_sigterm, signal.SIGINT: _on_sigint,
    }
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
