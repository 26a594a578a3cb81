"""The public surface: ``celery_sagas.__all__`` is pinned, and every name in it is documented."""

from __future__ import annotations

import pytest

import celery_sagas

EXPECTED = [
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


def test_all_is_pinned_and_sorted() -> None:
    assert celery_sagas.__all__ == EXPECTED
    # isort-style, as ruff keeps __all__: constants, then classes, then the rest, each sorted
    assert sorted(EXPECTED, key=lambda n: (not n.isupper(), not n[:1].isupper(), n)) == EXPECTED
    assert len(set(EXPECTED)) == len(EXPECTED)


@pytest.mark.parametrize("name", EXPECTED)
def test_every_exported_name_exists_and_has_a_docstring(name: str) -> None:
    value = getattr(celery_sagas, name)
    doc = value.__doc__
    assert isinstance(doc, str) and doc.strip(), f"{name} has no docstring"


def test_star_import_gives_exactly_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from celery_sagas import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(EXPECTED)


def test_the_package_documents_itself_and_its_version() -> None:
    assert celery_sagas.__doc__ and celery_sagas.__doc__.strip()
    assert isinstance(celery_sagas.__version__, str) and celery_sagas.__version__


def test_errors_live_in_their_module_and_only_those_user_code_meets_are_also_at_the_root() -> None:
    from celery_sagas import errors

    assert [n for n in EXPECTED if n in errors.__all__] == [
        "SagaUsageError", "SignalTimeout", "StepFailed", "StepNotCommitted"]
    assert celery_sagas.StepNotCommitted is errors.StepNotCommitted
    assert celery_sagas.StepFailed is errors.StepFailed
    assert celery_sagas.SagaUsageError is errors.SagaUsageError
    assert celery_sagas.SignalTimeout is errors.SignalTimeout
    assert issubclass(errors.SagaUsageError, errors.SagaError)


def test_an_error_imported_from_the_root_still_works_and_says_where_it_moved() -> None:
    from celery_sagas import errors

    with pytest.warns(DeprecationWarning, match="import SagaNotFound from celery_sagas.errors"):
        moved = celery_sagas.SagaNotFound
    assert moved is errors.SagaNotFound


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        celery_sagas.Nope  # noqa: B018


def test_what_the_facade_returns_is_exported() -> None:
    # the types a user meets through Sagas are importable from the package root
    import inspect

    hints = inspect.get_annotations(celery_sagas.Sagas.sweep, eval_str=True)
    assert hints["return"] is celery_sagas.SweepReport
    hints = inspect.get_annotations(celery_sagas.Sagas.findings, eval_str=True)
    assert hints["return"] is celery_sagas.FindingPage


@pytest.mark.parametrize("name", ["NondeterminismError", "SagaAmbiguousStepError"])
def test_an_error_never_raised_is_off_the_surface_and_importing_it_warns(name: str) -> None:
    from celery_sagas import errors

    assert name not in errors.__all__ and name not in dir(errors)
    with pytest.warns(DeprecationWarning, match=f"errors.{name} is never raised"):
        deprecated = getattr(errors, name)
    assert issubclass(deprecated, errors.SagaError)
    with pytest.warns(DeprecationWarning, match=f"import {name} from celery_sagas.errors"):
        assert getattr(celery_sagas, name) is deprecated
