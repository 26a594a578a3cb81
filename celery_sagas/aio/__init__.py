"""The asyncio client: ``sagas.aio`` (docs/async.md)."""

from ._facade import AsyncSagaHandle, AsyncSagas

__all__ = ["AsyncSagaHandle", "AsyncSagas"]
