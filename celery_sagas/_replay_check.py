"""The deploy check: replay the current code's ``run`` against every in-flight saga's recorded
steps, writing nothing, and report those that would become ``nondeterministic``
(docs/operations.md, "Deploying changed saga code").

A saga replays while it goes forward (``running``, or in review on its way forward); one that
rolls back never calls ``run`` again, so it cannot diverge. A saga whose definition this
process does not have would diverge too (its next advance fails), so it is reported.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ._context import SagaContext, replay
from ._definitions import Registry
from ._protocol.replay import Diverged
from ._records import SagaRecord, SagaState
from ._scans import CorruptRecord, Scans

__all__ = ["Divergence", "ReplayCheck", "replay_check"]

_PAGE = 200
_FORWARD = (SagaState.RUNNING, SagaState.MANUAL_REVIEW)


@dataclass(frozen=True, slots=True)
class Divergence:
    """A saga in flight that the current code would send to review as ``nondeterministic``."""

    saga_id: str
    definition: str
    reason: str


@dataclass(frozen=True, slots=True)
class ReplayCheck:
    """What ``replay_check`` found: how many sagas it replayed, those that diverge, and the
    records it could not read (corrupt, or sealed with a key this process lacks)."""

    checked: int
    divergences: tuple[Divergence, ...]
    unreadable: tuple[CorruptRecord, ...] = ()

    @property
    def ok(self) -> bool:
        """True when no saga in flight would become nondeterministic."""
        return not self.divergences


def _divergence(saga: SagaRecord, registry: Registry, now_ms: int,
                bucket_of: Callable[[str], int]) -> Divergence | None:
    definition = registry.definitions.get(saga.definition)
    if definition is None:
        return Divergence(saga.saga_id, saga.definition,
                          f"no saga definition {saga.definition!r} in this process")
    home = bucket_of(saga.saga_id)

    def colocate(candidate: str) -> str:  # as the engine does, so child ids match the record
        found, n = candidate, 0
        while bucket_of(found) != home:
            n += 1
            found = f"{candidate}.{n}"
        return found

    outcome = replay(definition, SagaContext(saga, registry, lambda: str(uuid.uuid4()), now_ms,
                                             lambda: uuid.uuid4().hex, colocate))
    if isinstance(outcome, Diverged):
        return Divergence(saga.saga_id, saga.definition, outcome.reason)
    return None


def replay_check(scans: Scans, registry: Registry, now_ms: int, *, definition: str | None = None,
                 limit: int | None = None, bucket_of: Callable[[str], int] = lambda _: 0,
                 ) -> ReplayCheck:
    """Replay every saga going forward (of ``definition``, at most ``limit``) with this
    process's code; read-only: nothing is written, nothing is sent."""
    checked = 0
    found: list[Divergence] = []
    unreadable: list[CorruptRecord] = []
    cursor: str | None = None
    while limit is None or checked < limit:
        size = _PAGE if limit is None else min(_PAGE, limit - checked)
        page = scans.sagas(list(_FORWARD), definition=definition, cursor=cursor, limit=size)
        unreadable.extend(page.corrupt)
        for saga in page.records:
            if saga.state is SagaState.MANUAL_REVIEW and saga.rolling_back:
                continue  # it compensates once resumed: run is not called again
            checked += 1
            divergence = _divergence(saga, registry, now_ms, bucket_of)
            if divergence is not None:
                found.append(divergence)
        cursor = page.cursor
        if cursor is None:
            break
    return ReplayCheck(checked, tuple(found), tuple(unreadable))
