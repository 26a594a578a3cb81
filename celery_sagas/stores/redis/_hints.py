"""The fix to name when a Redis URL's scheme does not fit the server behind it: a cluster
reached with ``redis://`` answers MOVED; a plain Redis reached with ``redis+cluster://`` says
that cluster mode is disabled (both only deep in the driver's error)."""

from __future__ import annotations

from redis.exceptions import AskError, MovedError, ResponseError

__all__ = ["scheme_hint"]

USE_CLUSTER = ("the server is a Redis Cluster node: use a redis+cluster:// URL "
               "(rediss+cluster:// with TLS)")
USE_PLAIN = ("cluster mode is disabled on that server, a plain Redis: use a redis:// URL "
             "(rediss:// with TLS), not redis+cluster://")
_CLUSTER_DISABLED = ("cluster mode is not enabled", "cluster support disabled")


def _redirect(exc: BaseException) -> bool:
    """A cluster's redirection as older redis-py (5.0) reports it: a plain ``ResponseError``."""
    return isinstance(exc, ResponseError) and str(exc).startswith(("MOVED ", "ASK "))


def scheme_hint(exc: BaseException) -> str | None:
    """The sentence naming the cause and the fix, or None when ``exc`` is about something else."""
    seen: BaseException | None = exc
    for _ in range(8):  # the driver chains its errors; a cycle must not loop forever
        if seen is None:
            return None
        if isinstance(seen, (MovedError, AskError)) or _redirect(seen):
            return USE_CLUSTER
        if any(text in str(seen).lower() for text in _CLUSTER_DISABLED):
            return USE_PLAIN
        seen = seen.__cause__ or seen.__context__
    return None
