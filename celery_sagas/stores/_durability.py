"""Warnings about a store server that may lose what it acknowledged, each logged once per
process (docs/guarantees.md#durability).

A store checks its server on first use; what it finds wrong is logged here once per process
and server, so a pool of workers warns once per child, not once per call or per store object.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["warn_once"]

logger = logging.getLogger("celery_sagas.stores")

_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def warn_once(reason: str, server: str, message: str) -> bool:
    """Log ``message`` as a WARNING unless this process already did for (reason, server);
    True if it was logged now. ``message`` must hold no secret (servers are shown redacted)."""
    with _lock:
        if (reason, server) in _warned:
            return False
        _warned.add((reason, server))
    logger.warning("%s", message)
    return True
