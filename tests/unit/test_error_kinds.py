"""The one classification of errors the CLI's exit codes and the web UI's statuses map from."""

from __future__ import annotations

import pytest

from celery_sagas._error_kinds import ErrorKind, error_kind
from celery_sagas.errors import (
    ApprovalDecisionError,
    FencedWriteRefused,
    InvalidRecordError,
    PayloadTooLarge,
    SagaConfigurationError,
    SagaError,
    SagaNotFound,
    SagaResolutionError,
    SagaValidationError,
    StoreError,
)
from celery_sagas.web._app import _status


@pytest.mark.parametrize(
    ("error", "kind", "status"),
    [(SagaNotFound(saga_id="x"), ErrorKind.NOT_FOUND, 404),
     (SagaValidationError("bad"), ErrorKind.INVALID, 400),
     (PayloadTooLarge("big"), ErrorKind.INVALID, 400),
     (SagaConfigurationError("no"), ErrorKind.MISCONFIGURED, 409),
     (StoreError("down"), ErrorKind.UNAVAILABLE, 503),
     (FencedWriteRefused("old fence"), ErrorKind.UNAVAILABLE, 503),
     (InvalidRecordError(kind="saga", record_id="x"), ErrorKind.UNAVAILABLE, 503),
     (SagaResolutionError("no"), ErrorKind.REFUSED, 409),
     (ApprovalDecisionError("no"), ErrorKind.REFUSED, 409)],
)
def test_an_error_has_one_kind_and_the_web_ui_maps_it_to_a_status(
        error: SagaError, kind: ErrorKind, status: int) -> None:
    # then
    assert error_kind(error) is kind
    assert _status(error) == status
