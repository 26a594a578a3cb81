"""``start_on_commit``: start a saga once the surrounding database transaction commits."""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

from celery import current_app
from django.db import transaction

from ... import _values as values
from ..._celery.facade import Saga, Sagas, sagas_of

__all__ = ["start_on_commit"]


def start_on_commit(saga: Saga | str, input: Any, saga_id: str | None = None, *,
                    using: str | None = None, sagas: Sagas | None = None) -> str:
    """Start ``saga`` with ``input`` once the transaction of database ``using`` commits; returns
    the saga id at once (``saga_id``, or a new UUID when it is None; "" is refused).

    The id, the definition and the input are checked now (``SagaValidationError``,
    ``SagaConfigurationError``: nothing is scheduled). Nothing is recorded or sent before the
    commit; if the transaction rolls back, the saga never starts. Outside a transaction it starts
    at once. At commit, ``Sagas.start`` runs as usual: a repeated id with the same input finds
    the saga already there, so a request retried after an error at commit is harmless; its
    errors (``SagaConflictError``, ``StoreError``) propagate from the block that committed, as
    Django does with ``on_commit`` callbacks. ``saga`` is a ``@sagas.saga`` definition or its
    name (looked up on ``sagas``, else on the current Celery app's ``Sagas``).
    """
    facade, name = _target(saga, sagas)
    saga_id = str(uuid.uuid4()) if saga_id is None else saga_id
    values.saga_id(saga_id)
    facade.registry.definition(name)
    canonical = values.encode_json(input, field="saga input", limit=facade.settings.payload_limit)
    frozen = values.decode_json(canonical)  # what the caller changes later is not started
    transaction.on_commit(partial(facade.start, name, frozen, saga_id), using=using)
    return saga_id


def _target(saga: Saga | str, sagas: Sagas | None) -> tuple[Sagas, str]:
    if isinstance(saga, Saga):
        return sagas or saga.sagas, saga.name
    return sagas or sagas_of(current_app), saga
