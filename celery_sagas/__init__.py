"""celery_sagas: durable sagas for Celery.

Steps are Celery tasks, compensators are registered Celery tasks, saga records live in Redis or
SQL, and Celery beat drives compensation retries and reconciliation sweeps.

The public surface is what this module exports: the ``Sagas`` facade and what it hands out
(contexts, handles, records, pages and reports), the approval gate, the lifecycle events, and
the ``Store`` plugin interface. Errors live in ``celery_sagas.errors`` (``StepNotCommitted``,
which step code raises, and ``SagaUsageError``, which a misused saga task raises, are here
too). Modules whose name starts with ``_`` are internal.
"""

from __future__ import annotations

import warnings
from typing import Any

from . import errors
from ._approvals.gate import ApprovalGate, PendingApproval
from ._celery import Saga, SagaHandle, Sagas, SagaSchedule
from ._context import CompensationReason, SagaContext, StepContext
from ._events import FindingEvent, LifecycleEvent, Phase, Stage
from ._findings import FindingPage
from ._protocol.findings import Finding, FindingKind
from ._records import (
    ENCRYPTED,
    ApprovalRecord,
    ApprovalState,
    Binding,
    EffectRecord,
    EffectState,
    HistoryEntry,
    HistoryEvent,
    ParentRef,
    SagaHistory,
    SagaRecord,
    SagaState,
    SignalRecord,
    StepRecord,
    StepState,
)
from ._replay_check import Divergence, ReplayCheck
from ._reseal import ResealPage
from ._scans import CorruptRecord, RecordPage
from ._sweep import SweepReport
from .errors import SagaUsageError, SignalTimeout, StepFailed, StepNotCommitted
from .stores import Envelope, Fence, Lease, MemoryStore, Page, Store, open_store

__version__ = "0.1.0"

__all__ = [
    "ENCRYPTED",
    "ApprovalGate",
    "ApprovalRecord",
    "ApprovalState",
    "Binding",
    "CompensationReason",
    "CorruptRecord",
    "Divergence",
    "EffectRecord",
    "EffectState",
    "Envelope",
    "Fence",
    "Finding",
    "FindingEvent",
    "FindingKind",
    "FindingPage",
    "HistoryEntry",
    "HistoryEvent",
    "Lease",
    "LifecycleEvent",
    "MemoryStore",
    "Page",
    "ParentRef",
    "PendingApproval",
    "Phase",
    "RecordPage",
    "ReplayCheck",
    "ResealPage",
    "Saga",
    "SagaContext",
    "SagaHandle",
    "SagaHistory",
    "SagaRecord",
    "SagaSchedule",
    "SagaState",
    "SagaUsageError",
    "Sagas",
    "SignalRecord",
    "SignalTimeout",
    "Stage",
    "StepContext",
    "StepFailed",
    "StepNotCommitted",
    "StepRecord",
    "StepState",
    "Store",
    "SweepReport",
    "errors",
    "open_store",
]


def __getattr__(name: str) -> Any:
    """Errors imported from the package root before they moved to ``celery_sagas.errors``."""
    if name in errors.__all__ or name in errors._DEPRECATED:
        warnings.warn(
            f"import {name} from celery_sagas.errors; celery_sagas.{name} will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        return errors._DEPRECATED.get(name) or getattr(errors, name)
    raise AttributeError(f"module 'celery_sagas' has no attribute {name!r}")
