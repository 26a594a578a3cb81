"""Drive sagas in-process for unit tests: messages are recorded, then delivered by hand.

    sagas = Sagas(app, store=MemoryStore(), allow_non_durable=True)
    driver = SagaDriver(sagas)          # messages now go to a RecordingDispatcher
    place_order.start(order, saga_id="o-1")
    driver.run_until_idle()             # deliver every message, as a worker would
    assert sagas.get("o-1").state == "completed"

Each delivery goes through the step's real task class (claim, body, commit, continuation), so
the same code paths as in a worker run; only the broker is replaced. Messages can also be
taken, duplicated, dropped or reordered to test delivery faults. End-to-end behaviour is proven
with real workers elsewhere; this is for fast, deterministic tests of saga definitions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._celery.messages import SAGA_REF, saga_ref
from .dispatcher import RecordingDispatcher, Sent

if TYPE_CHECKING:
    from .._celery.facade import Sagas

__all__ = ["SagaDriver"]


class SagaDriver:
    """Records a Sagas instance's messages and delivers them on demand."""

    def __init__(self, sagas: Sagas) -> None:
        self.sagas = sagas
        self.dispatcher = RecordingDispatcher()
        sagas._send_through(self.dispatcher)  # its runtime is built again around the recorder

    def take(self) -> list[Sent]:
        """Every message sent since the last take."""
        return self.dispatcher.take()

    def deliver(self, message: Sent) -> None:
        """Deliver one message to its task, as a worker would (task id = effect id)."""
        name = message.task or self._task_of(message)
        if name is None:
            return
        task = self.sagas.app.tasks[name]
        task.push_request(id=message.effect_id)
        try:
            task(**{SAGA_REF: saga_ref(message.saga_id, message.step, message.version)})
        finally:
            task.pop_request()

    def _task_of(self, message: Sent) -> str | None:
        """The task of a hand-made message that does not name one, from the saga record."""
        step = self.sagas.engine.load(message.saga_id).step(message.step)
        if step is None:
            return None
        return step.task if message.kind == "step" else step.compensator

    def run_until_idle(self, max_messages: int = 10_000) -> int:
        """Deliver messages (and those they cause) until none is left; returns how many."""
        delivered = 0
        while True:
            batch = self.take()
            if not batch:
                return delivered
            for message in batch:
                self.deliver(message)
                delivered += 1
                if delivered >= max_messages:
                    raise RuntimeError("saga messages kept coming; a loop?")
