"""The e2e app with a short retention and an archive (``celery -A tests.e2e.retention_app``).

Retention is ``E2E_RETENTION`` seconds (default 3). The archive appends each record it
receives as one JSON line to ``<E2E_CONTROL>/archive.jsonl``, and raises while the file
``<E2E_CONTROL>/archive-down`` exists.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery_sagas import SagaRecord
from tests.e2e.app import Config, Shop, build

ARCHIVE = "tests.e2e.retention_app:archive"


class ArchiveDown(Exception):
    """The archive's backend refuses writes."""


def archive(record: SagaRecord) -> None:
    """Append the record to the control directory's archive file, unless it is down."""
    control = Config.from_env().control
    if (control / "archive-down").exists():
        raise ArchiveDown(f"archive down, record of {record.saga_id} not written")
    with open(control / "archive.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record.to_dict()) + "\n")


def build_retaining(config: Config, retention: float) -> Shop:
    """The e2e shop with retention and the archive above."""
    return build(config, retention=retention, archive=ARCHIVE)


def retention_of(env: Any) -> float:
    """The retention a worker was started with."""
    return float(env.get("E2E_RETENTION", "3"))


if os.environ.get("E2E_BROKER"):
    app = build_retaining(Config.from_env(), retention_of(os.environ)).app
