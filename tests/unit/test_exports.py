"""The public surface: ``celery_sagas.__all__`` is pinned, and every name in it is documented."""

from __future__ import annotations

import pytest

import celery_sagas

EXPECTED = [
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


def test_all_is_pinned_and_sorted() -> None:
    assert celery_sagas.__all__ == EXPECTED
    assert sorted(EXPECTED) == EXPECTED
    assert len(set(EXPECTED)) == len(EXPECTED)


@pytest.mark.parametrize("name", EXPECTED)
def test_every_exported_name_exists_and_has_a_docstring(name: str) -> None:
    value = getattr(celery_sagas, name)
    doc = value.__doc__
    assert isinstance(doc, str) and doc.strip(), f"{name} has no docstring"


def test_star_import_gives_exactly_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from celery_sagas import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == EXPECTED


def test_the_package_documents_itself_and_its_version() -> None:
    assert celery_sagas.__doc__ and celery_sagas.__doc__.strip()
    assert isinstance(celery_sagas.__version__, str) and celery_sagas.__version__
