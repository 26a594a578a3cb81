"""Who claimed an effect, and whether that claimer is known to be gone.

A claim records ``host:pid`` of the process that started the body. On the same host a dead
pid proves the attempt vanished (a killed pool child), so a redelivery can settle it at once
instead of waiting for the time limit; across hosts nothing is known and the time limit plus
grace decides. "Host" includes the pid namespace (Linux): containers sharing a hostname (host
networking) each see only their own pids, so they never judge each other's claims.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from ._records import StepRecord, StepState

__all__ = ["PROCESS_ACTIVE", "ActiveEffects", "claim_tag", "claimer_id", "dead_effects"]


def _pid_namespace() -> str:
    """``~<inode>`` of this process's pid namespace, or nothing where there is none to read."""
    try:
        return f"~{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


_HOST = (socket.gethostname().replace(" ", "_")[:200] or "host") + _pid_namespace()


def claimer_id() -> str:
    """This process: ``host:pid``."""
    return f"{_HOST}:{os.getpid()}"


def claim_tag() -> str:
    """A claim by this process, unique per claim: ``host:pid/nonce``.

    The nonce makes two claims written in the same millisecond by two threads of one process
    differ, so a compare-and-set can never report both as the winner.
    """
    return f"{claimer_id()}/{secrets.token_hex(4)}"


class ActiveEffects:
    """Claim tags of the deliveries running in this process right now.

    A delivery registers its tag before it writes its claim and keeps it until its outcome is
    written, so a claim made by this process whose tag is absent belongs to an attempt that is
    gone (threads and gevent pools run several deliveries in one process).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tags: set[str] = set()

    @contextmanager
    def running(self, tag: str) -> Iterator[None]:
        """Mark a claim tag as live for the duration of the block."""
        with self._lock:
            self._tags.add(tag)
        try:
            yield
        finally:
            with self._lock:
                self._tags.discard(tag)

    def __contains__(self, tag: object) -> bool:
        with self._lock:
            return tag in self._tags


# One per process, shared by every engine in it: a claim tag names the process, not the
# engine, so two Sagas instances (a tasks module imported under two names) must agree.
PROCESS_ACTIVE = ActiveEffects()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _gone(claimer: str, active: ActiveEffects) -> bool:
    host, _, pid_text = claimer.split("/", 1)[0].rpartition(":")
    if host != _HOST or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return claimer not in active
    return not _pid_alive(pid)


def dead_effects(steps: Iterable[StepRecord], active: ActiveEffects) -> frozenset[str]:
    """Effect ids of claimed in-flight steps whose claimer is known to be gone."""
    dead: set[str] = set()
    for step in steps:
        if step.started_at_ms is None or step.claimed_by is None:
            continue
        compensating = step.state is StepState.COMPENSATING
        if step.state is not StepState.EXECUTING and not compensating:
            continue
        effect = step.compensation_effect_id if compensating else step.effect_id
        if _gone(step.claimed_by, active):
            dead.add(effect)
    return frozenset(dead)
