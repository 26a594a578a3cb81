"""Who claimed an effect (or holds a sweep lease), and whether that process is known to be gone.

A claim records ``host:pid`` of the process that started the body. On the same host a dead
pid proves the attempt vanished (a killed pool child): its outcome is unknown and the label
``worker_lost`` is true, so a redelivery can settle it at once instead of waiting for the time
limit. A live process is never judged lost, this one included: a delivery of it that ended
without an outcome (its store did not answer) is settled by the time limit like a claim of
another host, where nothing is known and the time limit plus grace decides. "Host" includes
the pid namespace (Linux): containers sharing a hostname (host networking) each see only
their own pids, so they never judge each other's claims.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterable

from ._records import StepRecord, StepState

__all__ = ["claim_tag", "claimer_id", "dead_effects", "process_gone"]


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def process_gone(claimer: str) -> bool:
    """Whether the process that wrote ``claimer`` (a claim tag, or a claimer id such as a sweep
    lease's owner) is known to be gone: another process of this host whose pid no longer runs.
    This process is alive (it is asking), and a process of another host is never judged by its
    pid: for both, the time limit (a lease's expiry) decides."""
    host, _, pid_text = claimer.split("/", 1)[0].rpartition(":")
    if host != _HOST or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    return pid != os.getpid() and not _pid_alive(pid)


def dead_effects(steps: Iterable[StepRecord]) -> frozenset[str]:
    """Effect ids of claimed in-flight steps whose claimer is known to be gone."""
    dead: set[str] = set()
    for step in steps:
        if step.started_at_ms is None or step.claimed_by is None:
            continue
        compensating = step.state is StepState.COMPENSATING
        if step.state is not StepState.EXECUTING and not compensating:
            continue
        effect = step.compensation_effect_id if compensating else step.effect_id
        if process_gone(step.claimed_by):
            dead.add(effect)
    return frozenset(dead)
