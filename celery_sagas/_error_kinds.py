"""What a library error means to an operator: the one classification the operator tools share.

The CLI maps each kind to an exit code and the web UI to an HTTP status; the mappings differ
(a configuration error is a usage error to the CLI, a refusal to the web UI), the
classification does not.
"""

from __future__ import annotations

from enum import Enum

from .errors import (
    InvalidRecordError,
    SagaConfigurationError,
    SagaError,
    SagaNotFound,
    SagaValidationError,
    StoreError,
)

__all__ = ["ErrorKind", "error_kind"]


class ErrorKind(Enum):
    """What went wrong, as an operator acts on it."""

    NOT_FOUND = "not-found"  # no such saga or approval
    INVALID = "invalid"  # an argument was refused before anything was tried
    MISCONFIGURED = "misconfigured"  # the app or the library is set up wrong
    UNAVAILABLE = "unavailable"  # the store failed, or a stored record cannot be read
    REFUSED = "refused"  # the library refused the operation; nothing changed


# The first row whose classes the error is an instance of names its kind.
_KINDS: tuple[tuple[tuple[type[SagaError], ...], ErrorKind], ...] = (
    ((SagaNotFound,), ErrorKind.NOT_FOUND),
    ((SagaValidationError,), ErrorKind.INVALID),
    ((SagaConfigurationError,), ErrorKind.MISCONFIGURED),
    ((StoreError, InvalidRecordError), ErrorKind.UNAVAILABLE),
)


def error_kind(exc: SagaError) -> ErrorKind:
    """The kind of a library error (``REFUSED`` for every error no row names)."""
    return next((kind for classes, kind in _KINDS if isinstance(exc, classes)), ErrorKind.REFUSED)
