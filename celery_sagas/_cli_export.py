"""The lines ``celery sagas export`` writes (docs/operations.md, "Exporting sagas"): a saga
record as one JSON object, or, for a saga whose payloads no configured key decrypts, its sealed
form as stored, under a ``sealed`` object, when the operator asked to keep it. A placeholder
is never written as if it were data."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import click

from ._records import SagaRecord
from .errors import UndecryptableRecord
from .stores.base import Store

__all__ = ["SAGA_KIND", "export_line", "export_target"]

SAGA_KIND = "saga"


class _Placeholder(Exception):
    """Raised while encoding: the record holds ``ENCRYPTED`` where a payload should be."""


def _refuse(value: object) -> Any:
    raise _Placeholder


def _encoded(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                      default=_refuse)


def export_line(record: SagaRecord, store: Store, *, keep_sealed: bool) -> str | None:
    """The JSON line of ``record`` (read for display); None when a sealed record is gone.

    A record with a payload no key decrypts raises UndecryptableRecord, or with ``keep_sealed``
    becomes ``{"saga_id", "state", "version", "updated_at_ms", "sealed": {"body", "notes"}}``:
    the body as stored (its payloads in one Fernet token), for a process with the key.
    """
    try:
        return _encoded(record.to_dict())
    except _Placeholder:
        pass
    if not keep_sealed:
        raise UndecryptableRecord(
            f"saga {record.saga_id!r} was encrypted with a key not in sagas_encryption_keys: "
            "export writes no placeholder as data; list the key, or pass --keep-sealed to "
            "write its sealed form", kind=SAGA_KIND, record_id=record.saga_id)
    envelope = store.get(SAGA_KIND, record.saga_id)
    if envelope is None:
        return None
    return _encoded({
        "saga_id": envelope.id, "definition": envelope.label, "state": envelope.state,
        "version": envelope.version, "updated_at_ms": envelope.updated_at_ms,
        "sealed": {"body": json.loads(envelope.body), "notes": list(envelope.notes)},
    })


@contextlib.contextmanager
def export_target(output: str | None) -> Iterator[IO[str]]:
    """Standard output, or a private temporary file beside ``output`` that replaces it only
    when the export is whole (a refused export leaves no partial file); a path that cannot be
    written is a usage error naming ``--output``."""
    if output is None:
        yield sys.stdout
        return
    target = Path(output)
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as exc:
        raise _unwritable(output, exc) from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            yield out
        try:
            os.replace(temporary, target)
        except OSError as exc:
            raise _unwritable(output, exc) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _unwritable(output: str, exc: OSError) -> click.BadParameter:
    return click.BadParameter(f"cannot write {output}: {exc.strerror or exc}", param_hint="--output")
