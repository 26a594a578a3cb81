"""Who claimed an effect, and whether that claimer is known to be gone.

A claim records ``host:pid`` of the process that started the body. On the same host a dead
pid proves the attempt vanished (a killed pool child), so a redelivery can settle it at once
instead of waiting for the time limit; across hosts nothing is known and the time limit plus
grace decides.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from .records import StepRecord, StepState

__all__ = ["ActiveEffects", "claim_tag", "claimer_id", "dead_effects"]

_HOST = socket.gethostname().replace(" ", "_")[:200] or "host"


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
    """Effect ids whose bodies are running in this process right now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[str] = set()

    @contextmanager
    def running(self, effect_id: str) -> Iterator[None]:
        """Mark an effect as running for the duration of the block."""
        with self._lock:
            self._ids.add(effect_id)
        try:
            yield
        finally:
            with self._lock:
                self._ids.discard(effect_id)

    def __contains__(self, effect_id: object) -> bool:
        with self._lock:
            return effect_id in self._ids


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _gone(claimer: str, effect_id: str, active: ActiveEffects) -> bool:
    host, _, pid_text = claimer.split("/", 1)[0].rpartition(":")
    if host != _HOST or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return effect_id not in active
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
        if _gone(step.claimed_by, effect, active):
            dead.add(effect)
    return frozenset(dead)
