"""celery_sagas: durable sagas for Celery.

Steps are Celery tasks, compensators are registered Celery tasks, saga records live in Redis or
SQL, and Celery beat drives compensation retries and reconciliation sweeps.
"""

from __future__ import annotations

from ._celery import Saga, SagaHandle, Sagas
from ._context import SagaContext, StepContext
from ._events import LifecycleEvent
from ._records import SagaRecord, SagaState, StepRecord, StepState
from .errors import (
    ApprovalBindingError,
    ApprovalDecisionError,
    ApprovalDenied,
    ApprovalError,
    ApprovalPending,
    ApprovalRequired,
    ApprovalTokenExpired,
    ApprovalTokenInvalid,
    ApprovalTokenReplay,
    FencedWriteRefused,
    IllegalTransition,
    InvalidRecordError,
    LeaseError,
    LeaseLost,
    NondeterminismError,
    NonDurableStoreError,
    PayloadTooLarge,
    SagaAmbiguousStepError,
    SagaConcurrencyError,
    SagaConfigurationError,
    SagaConflictError,
    SagaError,
    SagaNotFound,
    SagaResolutionError,
    SagaValidationError,
    StepNotCommitted,
    StoreError,
    StoreUnavailable,
)
from .stores import MemoryStore, open_store

__version__ = "0.1.0"

__all__ = [
    "ApprovalBindingError",
    "ApprovalDecisionError",
    "ApprovalDenied",
    "ApprovalError",
    "ApprovalPending",
    "ApprovalRequired",
    "ApprovalTokenExpired",
    "ApprovalTokenInvalid",
    "ApprovalTokenReplay",
    "FencedWriteRefused",
    "IllegalTransition",
    "InvalidRecordError",
    "LeaseError",
    "LeaseLost",
    "LifecycleEvent",
    "MemoryStore",
    "NonDurableStoreError",
    "NondeterminismError",
    "PayloadTooLarge",
    "Saga",
    "SagaAmbiguousStepError",
    "SagaConcurrencyError",
    "SagaConfigurationError",
    "SagaConflictError",
    "SagaContext",
    "SagaError",
    "SagaHandle",
    "SagaNotFound",
    "SagaRecord",
    "SagaResolutionError",
    "SagaState",
    "SagaValidationError",
    "Sagas",
    "StepContext",
    "StepNotCommitted",
    "StepRecord",
    "StepState",
    "StoreError",
    "StoreUnavailable",
    "open_store",
]
