"""Re-encrypting stored sagas under the newest key, one page at a time (docs/design.md §7).

After a key rotation, a saga written again is sealed with the new key; one never written again
(a finished saga) keeps the old seal. ``reseal_page`` rewrites each saga of a page whose payloads
are in clear or sealed with an older key: the same record, one version up, with the same
``updated_at_ms`` (its age, for staleness and retention, does not change), by compare-and-set,
so a concurrent writer is never overwritten. Once a walk over every state has rewritten
everything, the old key can be removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._frozen import replace
from ._records import SAGA, SagaState
from ._repository import SagaRepository
from ._scans import _states
from .errors import InvalidRecordError, SagaConcurrencyError, SagaConfigurationError, UndecryptableRecord

__all__ = ["ResealPage", "reseal_page"]


@dataclass(frozen=True, slots=True)
class ResealPage:
    """One page of a reseal walk: sagas rewritten, already sealed with the newest key (or
    written by someone else meanwhile), and the ids no listed key opens (or corrupt); plus the
    cursor of the next page (None when the walk is done)."""

    resealed: int
    current: int
    unreadable: tuple[str, ...]
    cursor: str | None


def reseal_page(repository: SagaRepository, *, states: Sequence[SagaState | str] | None = None,
                cursor: str | None = None, limit: int = 100) -> ResealPage:
    """Rewrite the sagas of one page (``states``: every state by default) that are not sealed
    with the newest key; SagaConfigurationError when no keys are configured."""
    codec = repository.codec
    if not codec.encrypts:
        raise SagaConfigurationError("resealing needs sagas_encryption_keys")
    names = _states(SagaState, list(states or SagaState))
    page = repository.store.scan(SAGA, names, cursor=cursor, limit=limit)
    resealed = current = 0
    unreadable: list[str] = []
    for envelope in page.items:
        if codec.sealed_with_newest(envelope):
            current += 1
            continue
        try:
            record = codec.saga(envelope, envelope.id)
        except (UndecryptableRecord, InvalidRecordError):
            unreadable.append(envelope.id)
            continue
        try:
            repository.write(record, replace(record, version=record.version + 1))
        except SagaConcurrencyError:
            current += 1  # written meanwhile, and so sealed by that write
            continue
        resealed += 1
    return ResealPage(resealed, current, tuple(unreadable), page.cursor)
